package connectivity

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/weirnet/weir/internal/k8s"
)

// Names of what the test makes. Every object carries labelTest, so a
// run that was killed is cleaned up by the next one.
const (
	DefaultNamespace = "weir-connectivity-test"
	labelTest        = "weir.io/connectivity-test"
	// probeBinary is where the agent image keeps weir-agent.
	probeBinary    = "/usr/bin/weir-agent"
	probeContainer = "probe"
	probeTCPPort   = 8080
	probeUDPPort   = 8081
	// The Service's ports in front of server-remote.
	serviceTCPPort = 80
	serviceUDPPort = 81
	// serviceNoEndpoints selects no pod: a connection to it must be
	// refused at once, not left to time out.
	serviceNoEndpoints = "no-endpoints"
)

// cnpName is the run's ClusterNetworkPolicy: cluster-scoped, so named
// after the run's namespace, as two runs in two namespaces must not
// share it.
func cnpName(ns string) string { return ns + "-deny" }

// The probe pods: two servers (one on each node), two clients on the
// first node (one granted by the policies, one not), and a client on the
// first node's own network.
const (
	podClient        = "client"
	podClientGranted = "client-granted"
	podHostClient    = "host-client"
	podServerLocal   = "server-local"  // on the clients' node
	podServerRemote  = "server-remote" // on the other node
	serviceName      = podServerRemote
)

// probePod is a probe pod: a server on the probe ports, or a client
// (which serves too, and is exec'd into to dial).
func probePod(ns, name, node, image string, labels map[string]string, hostNetwork bool) *corev1.Pod {
	labels[labelTest] = "true"
	args := []string{"probe", "serve"}
	if hostNetwork {
		// On the node's network: no port of the node is taken.
		args = append(args, "--tcp=", "--udp=")
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			HostNetwork:                   hostNetwork,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			AutomountServiceAccountToken:  ptr.To(false),
			// The agent's tolerations are the user's to set; the probes
			// run where the agent runs, so tolerate what it tolerates.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name:            probeContainer,
				Image:           image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{probeBinary},
				Args:            args,
				Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                ptr.To[int64](65534),
					RunAsNonRoot:             ptr.To(true),
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
		},
	}
}

// workloads are what the test deploys on nodes a (the clients' and
// server-local's) and b (server-remote's).
func workloads(ns, a, b, image string) []*corev1.Pod {
	return []*corev1.Pod{
		probePod(ns, podClient, a, image, map[string]string{"role": "client"}, false),
		probePod(ns, podClientGranted, a, image, map[string]string{"role": "client", "access": "granted"}, false),
		probePod(ns, podHostClient, a, image, map[string]string{"role": "host-client"}, true),
		probePod(ns, podServerLocal, a, image, map[string]string{"role": "server", "at": "local"}, false),
		probePod(ns, podServerRemote, b, image, map[string]string{"role": "server", "at": "remote"}, false),
	}
}

// namespace is the test's namespace; the node-network client needs the
// privileged Pod Security level there.
func namespace(ns string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		labelTest: "true", "pod-security.kubernetes.io/enforce": "privileged"}}}
}

// service is a NodePort Service (so a ClusterIP too) in front of
// server-remote, TCP and UDP.
func service(ns string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: serviceName, Namespace: ns, Labels: map[string]string{labelTest: "true"}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"role": "server", "at": "remote"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: serviceTCPPort, TargetPort: intstr.FromInt32(probeTCPPort), Protocol: corev1.ProtocolTCP},
				{Name: "udp", Port: serviceUDPPort, TargetPort: intstr.FromInt32(probeUDPPort), Protocol: corev1.ProtocolUDP},
			},
		},
	}
}

// noEndpointsService is a ClusterIP Service whose selector matches no pod.
func noEndpointsService(ns string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: serviceNoEndpoints, Namespace: ns, Labels: map[string]string{labelTest: "true"}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"role": "none"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: serviceTCPPort, TargetPort: intstr.FromInt32(probeTCPPort), Protocol: corev1.ProtocolTCP}},
		},
	}
}

// egressPolicy lets the client (not client-granted) open connections to
// server-local's TCP port alone.
func egressPolicy(ns string) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "client-to-server-local-only", Namespace: ns, Labels: map[string]string{labelTest: "true"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "access", Operator: metav1.LabelSelectorOpDoesNotExist}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"at": "local"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr.To(intstr.FromInt32(probeTCPPort))}},
			}},
		},
	}
}

// networkPolicy admits to server-remote only pods labelled
// access=granted, on the probe ports.
func networkPolicy(ns string) *networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server-remote-granted-only", Namespace: ns, Labels: map[string]string{labelTest: "true"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"at": "remote"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"access": "granted"}}}},
				Ports: []networkingv1.NetworkPolicyPort{
					{Protocol: &tcp, Port: ptr.To(intstr.FromInt32(probeTCPPort))},
					{Protocol: &udp, Port: ptr.To(intstr.FromInt32(probeUDPPort))},
				},
			}},
		},
	}
}

// clusterNetworkPolicy denies, at the Admin tier, the granted client's
// connections to server-local, which no NetworkPolicy selects: what a
// platform team's guard rail does whatever namespaces allow.
func clusterNetworkPolicy(ns string) *unstructured.Unstructured {
	sel := func(labels map[string]any) map[string]any {
		return map[string]any{
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": ns}},
			"podSelector":       map[string]any{"matchLabels": labels},
		}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": k8s.ClusterPolicyResource.GroupVersion().String(),
		"kind":       "ClusterNetworkPolicy",
		"metadata":   map[string]any{"name": cnpName(ns), "labels": map[string]any{labelTest: "true"}},
		"spec": map[string]any{
			"tier":     "Admin",
			"priority": int64(10),
			"subject":  map[string]any{"pods": sel(map[string]any{"at": "local"})},
			"ingress": []any{map[string]any{
				"name":   "no-granted-client",
				"action": "Deny",
				"from":   []any{map[string]any{"pods": sel(map[string]any{"access": "granted"})}},
			}},
		},
	}}
}

// pickNodes chooses two nodes to run on: Ready and schedulable, without
// taints when there are such, by name. One node gives a with b empty.
func pickNodes(nodes []corev1.Node) (a, b string, err error) {
	var clean, tainted []string
	for _, n := range nodes {
		if n.Spec.Unschedulable || !nodeReady(&n) {
			continue
		}
		if len(n.Spec.Taints) == 0 {
			clean = append(clean, n.Name)
		} else {
			tainted = append(tainted, n.Name)
		}
	}
	sort.Strings(clean)
	sort.Strings(tainted)
	all := append(clean, tainted...)
	switch len(all) {
	case 0:
		return "", "", errors.New("no Ready, schedulable node to run the probes on")
	case 1:
		return all[0], "", nil
	}
	return all[0], all[1], nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// agentImage is the image of the agent DaemonSet's agent container: on
// every node already.
func agentImage(ctx context.Context, c Cluster) (string, error) {
	list, err := c.Kube.AppsV1().DaemonSets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: k8s.AgentPodSelector})
	if err != nil {
		return "", fmt.Errorf("find the weir-agent DaemonSet for its image: %w", err)
	}
	for _, ds := range list.Items {
		if img := containerImage(&ds, k8s.AgentContainer); img != "" {
			return img, nil
		}
	}
	return "", fmt.Errorf("no DaemonSet labelled %s with an %q container: is Weir installed? (or pass --image)", k8s.AgentPodSelector, k8s.AgentContainer)
}

func containerImage(ds *appsv1.DaemonSet, name string) string {
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == name {
			return c.Image
		}
	}
	return ""
}

// deployed is what deploy made: the running probe pods, by name, and the
// Services.
type deployed struct {
	pods        map[string]*corev1.Pod
	svc         *corev1.Service // in front of server-remote
	noEndpoints *corev1.Service
}

// deploy creates the pods and the Services in the run's namespace, and
// waits until every pod runs.
func deploy(ctx context.Context, c Cluster, ns, a, b, image string, timeout time.Duration) (*deployed, error) {
	nodeB := b
	if nodeB == "" {
		nodeB = a
	}
	for _, p := range workloads(ns, a, nodeB, image) {
		if _, err := c.Kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create pod %s/%s: %w", ns, p.Name, err)
		}
	}
	d := &deployed{pods: map[string]*corev1.Pod{}}
	for _, s := range []struct {
		spec *corev1.Service
		made **corev1.Service
	}{{service(ns), &d.svc}, {noEndpointsService(ns), &d.noEndpoints}} {
		made, err := c.Kube.CoreV1().Services(ns).Create(ctx, s.spec, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("create Service %s/%s: %w", ns, s.spec.Name, err)
		}
		*s.made = made
	}
	pods := d.pods
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := c.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for i := range list.Items {
			p := &list.Items[i]
			if p.Status.Phase == corev1.PodFailed {
				return false, fmt.Errorf("pod %s/%s failed: %s", ns, p.Name, p.Status.Message)
			}
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				pods[p.Name] = p
			}
		}
		return len(pods) == len(workloads(ns, a, nodeB, image)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("probe pods not running after %v (%d of %d: %v); see kubectl -n %s get pods,events: %w",
			timeout, len(pods), len(workloads(ns, a, nodeB, image)), sortedKeys(pods), ns, err)
	}
	return d, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// cleanup deletes the run's ClusterNetworkPolicy (when it made one) and
// its namespace (with all in it), and waits until the namespace is gone,
// so a next run can start.
func cleanup(ctx context.Context, c Cluster, ns string, madeCNP bool, timeout time.Duration) error {
	var errs []error
	if madeCNP {
		err := c.Dynamic.Resource(k8s.ClusterPolicyResource).Delete(ctx, cnpName(ns), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete ClusterNetworkPolicy %s: %w", cnpName(ns), err))
		}
	}
	err := c.Kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return errors.Join(errs...)
	}
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("delete namespace %s: %w", ns, err))...)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := c.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("namespace %s still there after %v: %w", ns, timeout, err))
	}
	return errors.Join(errs...)
}
