// Package api is the node agent's local API: the request and response
// types the CNI plugin and the CLI exchange with weir-agent over its unix
// socket, the error codes (which are CNI error codes), and a client.
package api
