// Package image builds Weir's agent image without a container engine: one
// layer of static binaries per platform, an OCI image index over the
// platforms, written as an OCI image layout directory and as an OCI
// archive (that directory as a tar), which `ctr images import`,
// `skopeo copy oci-archive:` and `crane push` accept.
//
// The build is reproducible: file times, owners and the image's creation
// time come from the source commit, not the clock, so two builds of one
// commit have one digest. The lab imports an image built here, so it runs
// what an operator would.
package image
