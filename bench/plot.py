#!/usr/bin/python3
"""Draws bench/results/<scenario>.png from the scenario's JSON: medians as
bars, min..max of the repetitions as error bars."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        r = json.load(f)
    summary = r["summary"]
    if r["scenario"] == "pod-launch":
        return plot_pod_launch(r, dst)
    if r["scenario"] == "policy-scale":
        return plot_policy_scale(r, dst)
    if r["scenario"] == "services":
        return plot_services(r, dst)
    if r["scenario"] == "l7-gate":
        return plot_l7_gate(r, dst)
    if r["scenario"] == "l7":
        return plot_l7(r, dst)

    def rows(path, metric):
        return [s for s in summary if s["path"] == path and s["metric"] == metric]

    panels = [
        ("intra", "tcp_gbps", "intra-node TCP stream (Gbit/s)"),
        ("inter", "tcp_gbps", "inter-node TCP stream (Gbit/s)"),
        ("intra", "rr_avg_us", "intra-node TCP req/resp (µs)"),
        ("inter", "rr_avg_us", "inter-node TCP req/resp (µs)"),
        ("intra", "udp_gbps", "intra-node UDP delivered (Gbit/s)"),
        ("inter", "udp_gbps", "inter-node UDP delivered (Gbit/s)"),
        ("intra", "crr_per_s", "intra-node new TCP connections per second"),
        ("inter", "crr_per_s", "inter-node new TCP connections per second"),
        ("cni", "add_ms", "CNI ADD latency (ms): p50 bar, p99 whisker"),
        ("cni", "del_ms", "CNI DEL latency (ms): p50 bar, p99 whisker"),
    ]
    fig, axes = plt.subplots(5, 2, figsize=(12, 17))
    for ax, (path, metric, title) in zip(axes.flat, panels):
        data = rows(path, metric)
        names = [d["setup"] for d in data]
        med = [d["median"] for d in data]
        if path == "cni":
            lo = [0 for _ in data]
            hi = [d["p99"] - d["median"] for d in data]
        else:
            lo = [d["median"] - d["min"] for d in data]
            hi = [d["max"] - d["median"] for d in data]
        colors = ["#aec7e8" if "flows off" in n else "#1f77b4" if n.startswith("weir") else "#999999" for n in names]
        ax.bar(names, med, yerr=[lo, hi], capsize=4, color=colors)
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=20)
        for i, v in enumerate(med):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    fig.suptitle(f"Weir {r['scenario']} benchmark — {r['reps']} reps, medians\n{r['command']}")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(dst, dpi=90)


def plot_l7(r, dst):
    configs = ["no policy", "L3 rule", "L4 rule", "L7, 1 rule", "L7, 40 rules", "L7, 1 header regex rule (user space)",
               "L7, cluster-tier rule (user space)", "nginx proxy, 1 rule", "nginx proxy, 40 rules"]
    colors = ["#999999", "#aec7e8", "#aec7e8", "#1f77b4", "#1f77b4", "#9467bd", "#9467bd", "#ff7f0e", "#ff7f0e"]

    def stat(path, metric):
        return {s["setup"]: s for s in r["summary"] if s["path"] == path and s["metric"] == metric}

    fig, axes = plt.subplots(1, 2, figsize=(18, 7))
    ax = axes[0]
    data = stat("max rate", "rps")
    names = [n for n in configs if n in data]
    med = [data[n]["median"] for n in names]
    lo = [data[n]["median"] - data[n]["min"] for n in names]
    hi = [data[n]["max"] - data[n]["median"] for n in names]
    ax.bar(names, med, yerr=[lo, hi], capsize=4, color=[colors[configs.index(n)] for n in names])
    ax.set_title("requests/s at 100 keep-alive connections")
    ax.tick_params(axis="x", labelrotation=25)
    for i, v in enumerate(med):
        ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    ax = axes[1]
    pcts = [("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"), ("p999_ms", "p99.9")]
    width = 0.8 / len(pcts)
    for j, (metric, label) in enumerate(pcts):
        d = stat("constant rate", metric)
        xs = [i + j * width for i, n in enumerate(configs) if n in d]
        ax.bar(xs, [d[n]["median"] for n in configs if n in d], width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(configs))])
    ax.set_xticklabels(configs, rotation=25)
    ax.set_yscale("log")
    ax.set_title("latency (ms) at half no policy's most requests/s")
    ax.legend()
    fig.suptitle(f"Weir l7 benchmark (lab) — {r['reps']} reps, medians, min..max whiskers\n{r['command']}")
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(dst, dpi=90)


def plot_l7_gate(r, dst):
    setups = ["no policy", "strparser (pass)", "skb verdict (pass)", "kernel HTTP, 1 rule", "kernel HTTP, 40 rules"]
    panels = [("rps", "requests/s, 100 keep-alive connections"), ("p50_ms", "latency p50 (ms)"), ("p99_ms", "latency p99 (ms)")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 5))
    for ax, (metric, title) in zip(axes, panels):
        data = {s["setup"]: s for s in r["summary"] if s["metric"] == metric}
        names = [n for n in setups if n in data]
        med = [data[n]["median"] for n in names]
        lo = [data[n]["median"] - data[n]["min"] for n in names]
        hi = [data[n]["max"] - data[n]["median"] for n in names]
        ax.bar(names, med, yerr=[lo, hi], capsize=4, color=["#999999", "#1f77b4", "#aec7e8", "#2ca02c", "#98df8a"][: len(names)])
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=15)
        for i, v in enumerate(med):
            ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    fig.suptitle(f"Weir l7-gate benchmark — {r['reps']} reps, medians, min..max whiskers\n{r['command']}")
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(dst, dpi=90)


def plot_pod_launch(r, dst):
    """Per setup: p50 bars with p99 whiskers for each launch metric."""
    panels = [
        ("ready_ms", "create to Ready (ms)"),
        ("add_ms", "CNI ADD (ms)"),
        ("add_share_pct", "ADD share of the launch (%)"),
        ("del_ms", "CNI DEL (ms), all pods deleted at once"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.5))
    for ax, (metric, title) in zip(axes, panels):
        data = [s for s in r["summary"] if s["path"] == "launch" and s["metric"] == metric]
        data.sort(key=lambda d: (not d["setup"].startswith("weir"), d["setup"]))
        names = [d["setup"] for d in data]
        med = [d["median"] for d in data]
        hi = [d["p99"] - d["median"] for d in data]
        colors = ["#aec7e8" if "flows off" in n else "#1f77b4" if n.startswith("weir") else "#999999" for n in names]
        ax.bar(names, med, yerr=[[0] * len(data), hi], capsize=4, color=colors)
        ax.set_title(title + "\np50 bar, p99 whisker")
        for i, v in enumerate(med):
            ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    fig.suptitle(f"Weir pod-launch benchmark — {r['reps']} pods per setup\n{r['command']}")
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    fig.savefig(dst, dpi=90)


def plot_policy_scale(r, dst):
    """Rule-count panels (median bars, min..max whiskers), concurrent
    clients, and the policy-change latencies as sorted samples."""
    summary = r["summary"]

    def by(setup, path, metric):
        for s in summary:
            if s["setup"] == setup and s["path"] == path and s["metric"] == metric:
                return s
        return None

    def rules(name):
        return 0 if name == "no policy" else int(name.split()[0])

    levels = sorted({s["setup"] for s in summary if s["metric"] == "tcp_gbps" and s["setup"] != "raw veth"}, key=rules)
    fig, axes = plt.subplots(3, 2, figsize=(12, 12))
    panels = [
        ("intra", "tcp_gbps", "intra-node TCP stream (Gbit/s)"),
        ("inter", "tcp_gbps", "inter-node TCP stream (Gbit/s)"),
        ("intra", "rr_avg_us", "intra-node TCP req/resp (µs)"),
        ("inter", "rr_avg_us", "inter-node TCP req/resp (µs)"),
    ]
    for ax, (path, metric, title) in zip(axes.flat, panels):
        names = levels + (["raw veth"] if path == "intra" else [])
        data = [by(n, path, metric) for n in names]
        names = [n for n, d in zip(names, data) if d]
        data = [d for d in data if d]
        med = [d["median"] for d in data]
        err = [[d["median"] - d["min"] for d in data], [d["max"] - d["median"] for d in data]]
        colors = ["#999999" if n == "raw veth" else "#1f77b4" for n in names]
        ax.bar(names, med, yerr=err, capsize=4, color=colors)
        ax.set_title(title)
        for i, v in enumerate(med):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    ax = axes.flat[4]
    counts = sorted({int(s["path"].split()[0]) for s in summary if s["path"].endswith(" clients")})
    width = 0.4
    for k, (setup, color) in enumerate([("no policy", "#999999"), ("one policy", "#1f77b4")]):
        vals = [(by(setup, f"{n} clients", "rps_total") or {"median": 0})["median"] for n in counts]
        done = [(by(setup, f"{n} clients", "completed") or {"min": 0})["min"] for n in counts]
        xs = [i + (k - 0.5) * width for i in range(len(counts))]
        ax.bar(xs, vals, width, label=setup, color=color)
        for x, v, d, n in zip(xs, vals, done, counts):
            ax.text(x, v, f"{d:.0f}/{n}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(counts)), [f"{n} clients" for n in counts])
    ax.set_title("concurrent clients: requests/s (label: completed)")
    ax.legend()
    ax = axes.flat[5]
    for metric, color in [("grant_ms", "#1f77b4"), ("revoke_ms", "#ff7f0e")]:
        vals = sorted(s["value"] for s in r["samples"] if s["metric"] == metric)
        if vals:
            ax.plot(vals, [(i + 1) / len(vals) for i in range(len(vals))], label=metric.split("_")[0], color=color)
    ax.set_xscale("log")
    ax.set_xlabel("ms from the API write")
    ax.set_title("policy change to enforcement (CDF)")
    ax.legend()
    fig.suptitle(f"Weir policy-scale benchmark — {r['reps']} reps, medians\n{r['command']}")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(dst, dpi=90)


def plot_services(r, dst):
    """One line per Service proxy over the Service counts: medians, with
    min..max of the repetitions as error bars (p99 over all samples for
    the change-to-traffic panel)."""
    summary = r["summary"]
    proxies = [("weir", "#1f77b4"), ("kube-proxy nftables", "#ff7f0e"), ("kube-proxy iptables", "#999999")]

    def split(setup):
        proxy, count = setup.rsplit(", ", 1)
        return proxy, int(count.split()[0])

    panels = [
        ("intra", "crr_per_s", "intra-node new connections/s via ClusterIP", "median"),
        ("inter", "crr_per_s", "inter-node new connections/s via ClusterIP", "median"),
        ("nodeport", "crr_per_s", "NodePort from outside, new connections/s", "median"),
        ("intra", "conn_p99_ms", "intra whole connection via ClusterIP, p99 (ms)", "median"),
        ("inter", "rr_avg_us", "inter request/response via ClusterIP (µs)", "median"),
        ("dns", "dns_p99_ms", "DNS lookup p99 (ms)", "median"),
        ("change", "change_ms", "Service change to traffic p99 (ms)", "p99"),
        ("cost", "agent_rss_mib", "largest agent RSS (MiB)", "median"),
    ]
    fig, axes = plt.subplots(4, 2, figsize=(12, 16))
    for ax, (path, metric, title, stat) in zip(axes.flat, panels):
        for proxy, color in proxies:
            pts = sorted((split(s["setup"])[1], s) for s in summary
                         if s["path"] == path and s["metric"] == metric and split(s["setup"])[0] == proxy)
            if not pts:
                continue
            xs = [n for n, _ in pts]
            ys = [s[stat] for _, s in pts]
            if stat == "median":
                err = [[s["median"] - s["min"] for _, s in pts], [s["max"] - s["median"] for _, s in pts]]
                ax.errorbar(xs, ys, yerr=err, capsize=3, marker="o", label=proxy, color=color)
            else:
                ax.plot(xs, ys, marker="o", label=proxy, color=color)
        ax.set_xscale("log")
        ax.set_xlabel("Services in the cluster")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"Weir services benchmark — {r['reps']} reps per Service count\n{r['command']}")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(dst, dpi=90)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
