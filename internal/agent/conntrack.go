package agent

import (
	"context"
	"time"
)

// A revoked flow's record (weir_ct_revoked) is kept while the flow keeps
// sending and for revokedFlowIdle after: long past any TCP retransmission
// of a flow that gives up, and the table cannot fill with flows that are
// gone. The collector looks every revokedFlowGCEvery.
const (
	revokedFlowIdle    = 5 * time.Minute
	revokedFlowGCEvery = 30 * time.Second
)

// gcRevokedFlows forgets revoked flows that went quiet, until ctx ends.
func (a *Agent) gcRevokedFlows(ctx context.Context) {
	every(ctx, revokedFlowGCEvery, func() {
		n, err := a.dp.GCRevokedFlows(revokedFlowIdle)
		if err != nil {
			a.log.Warn("collect revoked flows", "err", err)
		} else if n > 0 {
			a.log.Debug("forgot quiet revoked flows", "count", n)
		}
	})
}

// every calls fn each interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
