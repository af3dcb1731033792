// Package service turns Kubernetes Services and EndpointSlices into the
// table the datapath translates ClusterIP traffic with: for every ClusterIP,
// port and protocol, the backends a new connection may go to.
//
// It is pure: no kernel, no client-go. The rules follow kube-proxy's, so a
// pod sees the same backends through Weir as through kube-proxy:
//
//   - ready endpoints serve; when none is ready, serving endpoints that are
//     terminating do (graceful termination), otherwise nothing does;
//   - internalTrafficPolicy: Local keeps only endpoints on this node;
//   - a named targetPort is resolved per EndpointSlice, so backends may
//     listen on different numbers;
//   - a frontend without backends is left out, and so is a Service whose
//     clients need session affinity: kube-proxy, which still runs, answers
//     them (with a reject, or with its affinity table).
package service
