// Package service turns Kubernetes Services and EndpointSlices into the
// table the datapath translates ClusterIP traffic with: for every ClusterIP,
// port and protocol, the backends a new connection may go to and how long a
// client keeps the one it had.
//
// It is pure: no kernel, no client-go. The rules follow kube-proxy's, so a
// pod sees the same backends through Weir as through kube-proxy:
//
//   - ready endpoints serve; when none is ready, serving endpoints that are
//     terminating do (graceful termination), otherwise nothing does;
//   - internalTrafficPolicy: Local keeps only endpoints on this node;
//   - a named targetPort is resolved per EndpointSlice, so backends may
//     listen on different numbers;
//   - sessionAffinity: ClientIP keeps a client on its backend for the
//     Service's timeout (three hours unless it says otherwise).
//
// Beside kube-proxy (the default), a frontend without backends is left
// out, and so is a Service with session affinity: kube-proxy answers them.
// With Options.ReplaceKubeProxy the table answers every ClusterIP itself: a
// frontend without backends is kept, empty, and rejects new connections.
package service
