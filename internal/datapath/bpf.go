package datapath

// The programs are compiled for the oldest instruction set the node kernels
// we support all have (v3: 32-bit jumps and ALU), with BTF kept so the
// verifier and bpftool can show source lines.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -mcpu=v3 -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type weir_addr -type endpoint_info -type tunnel_key -type tunnel_info -type cidr_key -type ep_policy -type policy_key -type policy_entry -type ct_key -type ct_entry -type verdict_event lxc ../../bpf/lxc.c
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -mcpu=v3 -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel overlay ../../bpf/overlay.c
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -mcpu=v3 -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type lb4_tuple -type lb4_nat -type lb4_frag_key host ../../bpf/host.c
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -mcpu=v3 -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type lb4_key -type lb4_service -type lb4_backend_key -type lb4_backend -type lb4_revnat_key -type lb4_revnat -type lb4_affinity_key -type lb4_affinity -type lb4_member_key -type lb4_flow_key -type lb4_flow sock ../../bpf/sock.c
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -mcpu=v3 -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel sockiter ../../bpf/sock_iter.c
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -mcpu=v3 -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type l7_sock_key -type l7_port -type l7_match_key -type l7_set -type l7_dfa_row -type l7_request_event -type l7_hash_key l7 ../../bpf/l7.c
// The HTTP reader of bpf/lib/http.h, alone in a tc program its tests run with
// BPF_PROG_RUN; only tests load it.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -mcpu=v3 -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type http_test_record httpreader ../../bpf/tests/http_reader.c
// What a verdict can answer a refused request with (TestL7AnswerFacts); only
// tests load it.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -mcpu=v3 -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel l7answer ../../bpf/tests/l7_answer.c
