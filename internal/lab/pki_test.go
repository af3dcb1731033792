package lab

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"strings"
	"testing"
)

func TestPKIIssuesChainedIdentities(t *testing.T) {
	p, err := newPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.issue(certSpec{name: "node-n1", cn: "system:node:n1", orgs: []string{"system:nodes"}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p.path("node-n1.crt"))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.caCert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("client certificate does not verify against the CA: %v", err)
	}
	if cert.Subject.CommonName != "system:node:n1" || cert.Subject.Organization[0] != "system:nodes" {
		t.Fatalf("subject %v: the Node authorizer needs CN=system:node:NAME, O=system:nodes", cert.Subject)
	}
	if err := p.kubeconfig(p.path("kc"), apiServerURL(), "node-n1"); err != nil {
		t.Fatal(err)
	}
	kc, _ := os.ReadFile(p.path("kc"))
	if !strings.Contains(string(kc), "server: https://10.99.0.10:6443") || !strings.Contains(string(kc), "node-n1.key") {
		t.Fatalf("kubeconfig:\n%s", kc)
	}
	if info, _ := os.Stat(p.path("node-n1.key")); info.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v, want 0600", info.Mode().Perm())
	}
}
