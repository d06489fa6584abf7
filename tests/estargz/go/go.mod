module rukpak.test/estargz-check

go 1.25.0

require (
	github.com/containerd/stargz-snapshotter/estargz v0.19.1
	github.com/opencontainers/go-digest v1.0.0
)

require (
	github.com/klauspost/compress v1.20.1 // indirect
	github.com/vbatts/tar-split v0.12.3 // indirect
)
