package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times; it is
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// usage is a reading of the machine's and the agents' CPU time and the
// agents' resident memory.
type usage struct {
	at         time.Time
	busy, all  uint64  // machine, in ticks of /proc/stat
	agentTicks uint64  // every agent's user+system time
	rssMiB     float64 // the largest agent's resident set
}

func readUsage(pids []int) (usage, error) {
	u := usage{at: time.Now()}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return u, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	// user nice system idle iowait irq softirq steal; guest time is
	// already inside user and nice.
	fields := strings.Fields(line)
	for i, f := range fields[1:min(9, len(fields))] {
		v, _ := strconv.ParseUint(f, 10, 64)
		u.all += v
		if i != 3 && i != 4 { // idle, iowait
			u.busy += v
		}
	}
	for _, pid := range pids {
		t, rss, err := procUsage(pid)
		if err != nil {
			return u, err
		}
		u.agentTicks += t
		u.rssMiB = max(u.rssMiB, rss)
	}
	return u, nil
}

// procUsage reads one process's CPU ticks and resident memory in MiB.
func procUsage(pid int) (uint64, float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("agent pid %d: %w", pid, err)
	}
	// Fields after the command, which may hold spaces, start after ") ".
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: short line", pid)
	}
	utime, _ := strconv.ParseUint(f[11], 10, 64)
	stime, _ := strconv.ParseUint(f[12], 10, 64)
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	var rssKiB float64
	for _, l := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			rssKiB, _ = strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		}
	}
	return utime + stime, rssKiB / 1024, nil
}

// busyPct is the machine's CPU use since before, in percent of all CPUs.
func (u usage) busyPct(before usage) float64 {
	if u.all == before.all {
		return 0
	}
	return 100 * float64(u.busy-before.busy) / float64(u.all-before.all)
}

// agentPct is the agents' CPU use since before, in percent of one CPU.
func (u usage) agentPct(before usage) float64 {
	wall := u.at.Sub(before.at).Seconds()
	if wall <= 0 {
		return 0
	}
	return 100 * float64(u.agentTicks-before.agentTicks) / clockTicks / wall
}

// cpuStall reads the machine's total time, since boot, during which some
// runnable task waited for a CPU (/proc/pressure/cpu, "some"). Over an
// interval, its share of the wall time says how contended the CPUs were:
// a slow policy change under high pressure waited for a CPU, not on Weir.
func cpuStall() (time.Duration, error) {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return 0, fmt.Errorf("read CPU pressure (a kernel with CONFIG_PSI): %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "some ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "total="); ok {
				us, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("CPU pressure total %q: %w", v, err)
				}
				return time.Duration(us) * time.Microsecond, nil
			}
		}
	}
	return 0, fmt.Errorf("no \"some ... total=\" line in /proc/pressure/cpu")
}
