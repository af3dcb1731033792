package datapath

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// attachPinned makes prog the tcx program of ifindex in the given direction
// and pins the link at pin. A link already pinned there is updated in
// place, which swaps the program atomically: an agent upgrade never leaves
// an interface without its program, not even for one packet.
func attachPinned(prog *ebpf.Program, ifindex int, at ebpf.AttachType, pin string) (retErr error) {
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		defer old.Close()
		if info, err := old.Info(); err == nil && info.TCX() != nil && int(info.TCX().Ifindex) == ifindex {
			if err := old.Update(prog); err == nil {
				return nil
			}
		}
		// The pin belongs to a vanished interface or cannot be updated.
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("unpin stale link %s: %w", pin, err)
		}
	}

	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
	if err != nil {
		return fmt.Errorf("attach tcx to ifindex %d: %w", ifindex, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	return nil
}

// detachPinned removes the link pinned at pin; a missing pin is not an error.
func detachPinned(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		// Unreadable pin (e.g. not a link): remove the file so nothing leaks.
		if rmErr := os.Remove(pin); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			return fmt.Errorf("remove pin %s: %w", pin, errors.Join(err, rmErr))
		}
		return nil
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpin %s: %w", pin, err)
	}
	// Closing the last reference detaches the program from the interface.
	return nil
}
