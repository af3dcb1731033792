package api

import (
	"errors"
	"fmt"
)

// Error codes. Below 100 they are the CNI specification's well-known codes;
// from 100 on they are Weir's own, as the specification reserves them.
const (
	CodeIncompatibleVersion = 1
	CodeUnknownContainer    = 3
	CodeInvalidEnv          = 4
	CodeIOFailure           = 5
	CodeDecodeFailure       = 6
	CodeInvalidConfig       = 7
	CodeTryAgainLater       = 11
	CodeNotAvailable        = 50

	CodePoolExhausted   = 100
	CodeAttachmentInUse = 101
	CodeInterfaceExists = 102
	CodeDatapath        = 103
)

// Error is the body of every failed agent request.
type Error struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
}

func (e *Error) Error() string {
	if e.Details == "" {
		return e.Msg
	}
	return e.Msg + ": " + e.Details
}

// Errorf builds an Error.
func Errorf(code uint, msg string, details error) *Error {
	e := &Error{Code: code, Msg: msg}
	if details != nil {
		e.Details = details.Error()
	}
	return e
}

// ErrAgentUnavailable is wrapped by the client when the agent cannot be reached.
var ErrAgentUnavailable = errors.New("weir-agent is not reachable")

// CodeOf returns the code of an *Error in err's chain, or CodeIOFailure.
func CodeOf(err error) uint {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	if errors.Is(err, ErrAgentUnavailable) {
		return CodeTryAgainLater
	}
	return CodeIOFailure
}

// unavailable wraps a transport error.
func unavailable(socket string, err error) error {
	return fmt.Errorf("%w at %s (is the agent running on this node?): %w", ErrAgentUnavailable, socket, err)
}
