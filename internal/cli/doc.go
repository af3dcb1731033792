// Package cli holds the weir command's verbs, one file per verb, each a
// New...Command returning a *cobra.Command whose logic sits in a run
// function taking its flags, a context and an io.Writer.
package cli
