package l7

import (
	"errors"
	"fmt"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
)

// A DFA judges a set's path regular expressions at once, a byte at a time,
// so the kernel can do it: one table lookup per path byte, whatever the
// expressions. Rules match a regular expression against the whole
// canonical path (Compile anchors it), and canonical paths are ASCII
// (CanonicalPath), so the automaton reads bytes 0-127 and is exact there;
// a byte over 127 has no transition it could take (Match says so).
//
// It is built from Go's own compiled program (regexp/syntax), with Go's
// own predicates for which bytes an instruction takes and which empty
// assertions hold between two bytes, so it answers as regexp does.
type DFA struct {
	// Next is the transition table: Next[s][b] is the state after byte b
	// in state s. State 0 is dead (no rule can match from it, and it
	// goes nowhere else); Start is where a path begins.
	Next  [][DFAColumns]uint16
	Start uint16
	// Accept[s] is the mask of the rules (bit r: rule r) whose
	// expressions match a path that ends in state s.
	Accept []uint64
	// Rules is the mask of the rules it judges.
	Rules uint64
}

// DFAColumns is the alphabet a DFA reads: ASCII.
const DFAColumns = 128

// DFALimits bound what a DFA may cost: the kernel holds every state as a
// row of DFAColumns transitions.
type DFALimits struct {
	// States is the most states a set's automaton may have.
	States int
	// Insts is the most instructions one expression's program may have
	// (counted repetitions expand: a{1000} is a thousand).
	Insts int
	// Work bounds the construction of one set's automaton, all its
	// expressions tried (instructions and threads visited): what is left
	// when it runs out stays in user space, so no policy can hold up the
	// agent.
	Work int
}

// DefaultDFALimits: 1,024 states (264 KiB of rows in the kernel) per set,
// 2,048 instructions per expression, and work for about a second on this
// machine (64 expressions such as /api/v[0-9]+/svcN/[a-z]+ take a sixth of
// it).
var DefaultDFALimits = DFALimits{States: 1024, Insts: 2048, Work: 30_000_000}

// ErrDFATooLarge is an expression whose automaton, alone or with the
// set's others, would go over the limits: it is judged in user space.
var ErrDFATooLarge = errors.New("too large for the kernel's automaton")

// PathRegex is one rule's path regular expression, as written in the
// rule; Rule is the rule's bit in the masks, 0 to 63.
type PathRegex struct {
	Rule    int
	Pattern string
}

// CompilePathDFA builds one automaton for as many of regexes as fit
// within lim, taking them in order: an expression that would take the
// automaton over the limits is left out, with its error in refused (keyed
// by rule), and the rest go on. nil when none fit.
func CompilePathDFA(regexes []PathRegex, lim DFALimits) (d *DFA, refused map[int]error) {
	refused = map[int]error{}
	var (
		progs []*syntax.Prog
		rules []int
	)
	work := lim.Work
	for _, r := range regexes {
		if r.Rule < 0 || r.Rule >= MaxKernelRules {
			refused[r.Rule] = fmt.Errorf("%w: rule %d has no bit in a 64-bit mask", ErrDFATooLarge, r.Rule)
			continue
		}
		prog, err := compileAnchored(r.Pattern, lim)
		if err != nil {
			refused[r.Rule] = err
			continue
		}
		next, err := determinize(append(progs, prog), lim, &work)
		if err != nil {
			refused[r.Rule] = err
			continue
		}
		progs, rules, d = append(progs, prog), append(rules, r.Rule), next
	}
	if d != nil {
		d.toRuleBits(rules)
	}
	return d, refused
}

// toRuleBits renames the accept masks' bits, one per program, to the
// rules the programs are (bit i to bit rules[i]).
func (d *DFA) toRuleBits(rules []int) {
	for s, m := range d.Accept {
		var out uint64
		for i, r := range rules {
			if m&(1<<i) != 0 {
				out |= 1 << r
			}
		}
		d.Accept[s] = out
	}
	for _, r := range rules {
		d.Rules |= 1 << r
	}
}

// compileAnchored compiles pattern as Compile's matcher does
// (compileWhole): the whole string, Perl flags, simplified.
func compileAnchored(pattern string, lim DFALimits) (*syntax.Prog, error) {
	if _, err := syntax.Parse(pattern, syntax.Perl); err != nil {
		return nil, fmt.Errorf("path regular expression %q: %w", pattern, err)
	}
	re, err := syntax.Parse(`^(?:`+pattern+`)$`, syntax.Perl)
	if err != nil {
		return nil, fmt.Errorf("path regular expression %q: %w", pattern, err)
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, fmt.Errorf("path regular expression %q: %w", pattern, err)
	}
	if len(prog.Inst) > lim.Insts {
		return nil, fmt.Errorf("%w: %q compiles to %d instructions, over %d", ErrDFATooLarge, pattern, len(prog.Inst), lim.Insts)
	}
	return prog, nil
}

// Match runs d over path and returns the mask of the rules whose
// expressions match all of it; ok is false when path holds a byte over
// 127, which d cannot read (canonical paths never do).
func (d *DFA) Match(path string) (mask uint64, ok bool) {
	s := d.Start
	for i := 0; i < len(path); i++ {
		if path[i] >= DFAColumns {
			return 0, false
		}
		s = d.Next[s][path[i]]
	}
	return d.Accept[s], true
}

// The context of the byte before a position, as far as empty-width
// assertions can tell (syntax.EmptyOpContext): the start of the text, a
// newline, a word byte, another byte.
const (
	prevStart = iota
	prevNewline
	prevWord
	prevOther
)

// prevRune is a byte that stands for context c.
var prevRune = [...]rune{prevStart: -1, prevNewline: '\n', prevWord: 'a', prevOther: '-'}

// thread is an instruction pc of one expression's program.
type thread struct {
	prog int
	pc   uint32
}

// nfaState is a state of the subset construction: the threads waiting to
// read the next byte (before following empty transitions, which depend
// on that byte) and the context of the byte before.
type nfaState struct {
	threads []thread // sorted, no duplicates
	prev    int
}

func (s nfaState) key() string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(s.prev))
	for _, t := range s.threads {
		b.WriteByte(' ')
		b.WriteString(strconv.Itoa(t.prog))
		b.WriteByte(':')
		b.WriteString(strconv.FormatUint(uint64(t.pc), 10))
	}
	return b.String()
}

// builder is one subset construction over a set's programs.
type builder struct {
	progs []*syntax.Prog
	// contexts says which byte contexts the programs can tell apart;
	// the others are folded into prevOther, so they cost no states.
	newline, word bool
	states        []nfaState
	index         map[string]int
	// classOf maps each byte to its class (byteClasses), reps holds a
	// byte of each; next[s][k] is the state after class k in state s.
	classOf [DFAColumns]int
	reps    []byte
	next    [][]int
	accept  []uint64
	// seen marks the threads a closure visited: seen[prog][pc] == stamp.
	seen  [][]uint32
	stamp uint32
	// work is what is left of the construction's budget.
	work *int
}

// determinize builds the minimal automaton of progs (bit i of its masks:
// progs[i] matched), or ErrDFATooLarge; it spends *work (instructions
// and threads visited), and fails when that runs out.
func determinize(progs []*syntax.Prog, lim DFALimits, work *int) (*DFA, error) {
	b := &builder{progs: progs, index: map[string]int{}, work: work}
	for _, p := range progs {
		for _, in := range p.Inst {
			if in.Op != syntax.InstEmptyWidth {
				continue
			}
			op := syntax.EmptyOp(in.Arg)
			b.newline = b.newline || op&(syntax.EmptyBeginLine|syntax.EmptyEndLine) != 0
			b.word = b.word || op&(syntax.EmptyWordBoundary|syntax.EmptyNoWordBoundary) != 0
		}
	}
	start := nfaState{prev: prevStart}
	for i, p := range progs {
		start.threads = append(start.threads, thread{i, uint32(p.Start)})
	}
	// The construction may take more states than the minimal automaton
	// keeps; bound it too, so a blow-up stops early.
	buildCap := 4 * lim.States
	b.classOf, b.reps = b.byteClasses()
	for _, p := range progs {
		b.seen = append(b.seen, make([]uint32, len(p.Inst)))
	}
	b.add(start)
	for s := 0; s < len(b.states); s++ {
		if len(b.states) > buildCap {
			return nil, fmt.Errorf("%w: over %d states", ErrDFATooLarge, lim.States)
		}
		if *b.work < 0 {
			return nil, fmt.Errorf("%w: the set's expressions took more work to build than allowed", ErrDFATooLarge)
		}
		b.accept[s] = b.acceptAtEnd(b.states[s])
		for k, c := range b.reps {
			b.next[s][k] = b.add(b.step(b.states[s], c))
		}
	}
	d := b.minimize()
	if *b.work < 0 {
		return nil, fmt.Errorf("%w: the set's expressions took more work to build than allowed", ErrDFATooLarge)
	}
	if len(d.Next) > lim.States {
		return nil, fmt.Errorf("%w: %d states, over %d", ErrDFATooLarge, len(d.Next), lim.States)
	}
	return d, nil
}

// byteClasses groups the bytes no instruction of the programs, and no
// assertion, tells apart: a state goes to the same state on each byte of
// a class, so the construction steps once per class. It returns each
// byte's class and a byte of each.
func (b *builder) byteClasses() (classOf [DFAColumns]int, reps []byte) {
	var ins []*syntax.Inst
	for _, p := range b.progs {
		for i := range p.Inst {
			switch p.Inst[i].Op {
			case syntax.InstRune, syntax.InstRune1, syntax.InstRuneAny, syntax.InstRuneAnyNotNL:
				ins = append(ins, &p.Inst[i])
			}
		}
	}
	index := map[string]int{}
	for c := range DFAColumns {
		sig := make([]byte, 0, len(ins)+1)
		// Its context decides the assertions between it and the byte
		// before (a newline, a word byte) as well as after it.
		sig = append(sig, byte(b.contextOf(byte(c))))
		for _, in := range ins {
			if takes(in, byte(c)) {
				sig = append(sig, 1)
			} else {
				sig = append(sig, 0)
			}
		}
		k := string(sig)
		id, ok := index[k]
		if !ok {
			id = len(reps)
			index[k] = id
			reps = append(reps, byte(c))
		}
		classOf[c] = id
	}
	return classOf, reps
}

// add returns the index of s, adding it when new.
func (b *builder) add(s nfaState) int {
	*b.work -= len(s.threads) + 1
	k := s.key()
	if i, ok := b.index[k]; ok {
		return i
	}
	b.index[k] = len(b.states)
	b.states = append(b.states, s)
	b.next = append(b.next, make([]int, len(b.reps)))
	b.accept = append(b.accept, 0)
	return len(b.states) - 1
}

// contextOf is the context byte c leaves for the next position, folded
// to what the programs can tell apart.
func (b *builder) contextOf(c byte) int {
	switch {
	case c == '\n' && b.newline:
		return prevNewline
	case syntax.IsWordChar(rune(c)) && b.word:
		return prevWord
	}
	return prevOther
}

// closure follows the empty transitions of threads that hold under flag,
// calling visit for each instruction that reads a byte or matches.
func (b *builder) closure(threads []thread, flag syntax.EmptyOp, visit func(t thread, in *syntax.Inst)) {
	b.stamp++
	var walk func(t thread)
	walk = func(t thread) {
		if b.seen[t.prog][t.pc] == b.stamp {
			return
		}
		b.seen[t.prog][t.pc] = b.stamp
		*b.work--
		in := &b.progs[t.prog].Inst[t.pc]
		switch in.Op {
		case syntax.InstAlt, syntax.InstAltMatch:
			walk(thread{t.prog, in.Out})
			walk(thread{t.prog, in.Arg})
		case syntax.InstNop, syntax.InstCapture:
			walk(thread{t.prog, in.Out})
		case syntax.InstEmptyWidth:
			if syntax.EmptyOp(in.Arg)&^flag == 0 {
				walk(thread{t.prog, in.Out})
			}
		case syntax.InstFail:
		default: // a rune instruction, or InstMatch
			visit(t, in)
		}
	}
	for _, t := range threads {
		walk(t)
	}
}

// step is the state after reading c in s.
func (b *builder) step(s nfaState, c byte) nfaState {
	out := nfaState{prev: b.contextOf(c)}
	flag := syntax.EmptyOpContext(prevRune[s.prev], rune(c))
	b.closure(s.threads, flag, func(t thread, in *syntax.Inst) {
		if takes(in, c) {
			out.threads = append(out.threads, thread{t.prog, in.Out})
		}
	})
	slices.SortFunc(out.threads, func(x, y thread) int {
		if x.prog != y.prog {
			return x.prog - y.prog
		}
		return int(x.pc) - int(y.pc)
	})
	out.threads = slices.Compact(out.threads)
	if len(out.threads) == 0 {
		out.prev = prevOther // one dead state, whatever came before
	}
	return out
}

// takes says whether instruction in reads byte c, as regexp's own machine
// decides it for the rune c.
func takes(in *syntax.Inst, c byte) bool {
	r := rune(c)
	switch in.Op {
	case syntax.InstRune:
		return in.MatchRune(r)
	case syntax.InstRune1:
		return r == in.Rune[0]
	case syntax.InstRuneAny:
		return true
	case syntax.InstRuneAnyNotNL:
		return r != '\n'
	}
	return false
}

// acceptAtEnd is the mask of the programs that match when the text ends
// in s.
func (b *builder) acceptAtEnd(s nfaState) uint64 {
	var mask uint64
	b.closure(s.threads, syntax.EmptyOpContext(prevRune[s.prev], -1), func(t thread, in *syntax.Inst) {
		if in.Op == syntax.InstMatch {
			mask |= 1 << t.prog
		}
	})
	return mask
}

// minimize merges the states no path can tell apart (Moore's refinement,
// from the partition by accept mask) and numbers the result: the class
// of states that can never accept becomes 0, the start's 1 (unless it is
// dead), the others in the order a breadth-first walk from the start
// meets them.
func (b *builder) minimize() *DFA {
	n := len(b.states)
	class := make([]int, n)
	byMask := map[uint64]int{}
	for s := range n {
		c, ok := byMask[b.accept[s]]
		if !ok {
			c = len(byMask)
			byMask[b.accept[s]] = c
		}
		class[s] = c
	}
	classes := len(byMask)
	for {
		*b.work -= n * (len(b.reps) + 1)
		sig := map[string]int{}
		next := make([]int, n)
		var key strings.Builder
		for s := range n {
			key.Reset()
			key.WriteString(strconv.Itoa(class[s]))
			for _, t := range b.next[s] {
				key.WriteByte(',')
				key.WriteString(strconv.Itoa(class[t]))
			}
			k := key.String()
			id, ok := sig[k]
			if !ok {
				id = len(sig)
				sig[k] = id
			}
			next[s] = id
		}
		class = next
		if len(sig) == classes {
			break
		}
		classes = len(sig)
	}
	// A class is dead when nothing it reaches accepts.
	live := make([]bool, classes)
	for changed := true; changed; {
		changed = false
		for s := range n {
			if live[class[s]] {
				continue
			}
			if b.accept[s] != 0 {
				live[class[s]], changed = true, true
				continue
			}
			for _, t := range b.next[s] {
				if live[class[t]] {
					live[class[s]], changed = true, true
					break
				}
			}
		}
	}
	// Number the live classes breadth first from the start; dead is 0.
	number := make([]int, classes)
	for i := range number {
		number[i] = -1
	}
	rep := map[int]int{} // a state of each numbered class
	order := []int{}
	visit := func(s int) {
		c := class[s]
		if !live[c] || number[c] >= 0 {
			return
		}
		number[c] = len(order) + 1
		rep[c] = s
		order = append(order, c)
	}
	visit(0)
	for i := 0; i < len(order); i++ {
		for _, t := range b.next[rep[order[i]]] {
			visit(t)
		}
	}
	d := &DFA{Next: make([][DFAColumns]uint16, len(order)+1), Accept: make([]uint64, len(order)+1)}
	if live[class[0]] {
		d.Start = 1
	}
	for i, c := range order {
		s := rep[c]
		d.Accept[i+1] = b.accept[s]
		for col := range DFAColumns {
			if t := class[b.next[s][b.classOf[col]]]; live[t] {
				d.Next[i+1][col] = uint16(number[t])
			}
		}
	}
	return d
}
