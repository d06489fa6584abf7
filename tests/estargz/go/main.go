// Command estargz-check reads an eStargz layer with the reference implementation
// (github.com/containerd/stargz-snapshotter/estargz) and prints what it sees as JSON:
// the TOC digest it verified and, per entry, its type, size, mode, link target and the
// sha256 of the content the reader returns. The Python tests compare that with what
// an ordinary tar.gz reader finds in the same layer.
//
// Usage: estargz-check LAYER TOC_DIGEST
package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"

	"github.com/containerd/stargz-snapshotter/estargz"
	digest "github.com/opencontainers/go-digest"
)

type entry struct {
	Type     string `json:"type"`
	Size     int64  `json:"size"`
	Mode     int64  `json:"mode"`
	LinkName string `json:"linkName,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
	Digest   string `json:"digest,omitempty"`
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: estargz-check LAYER TOC_DIGEST")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "estargz-check:", err)
		os.Exit(1)
	}
}

func run(layer, tocDigest string) error {
	f, err := os.Open(layer)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	r, err := estargz.Open(io.NewSectionReader(f, 0, st.Size()))
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	want, err := digest.Parse(tocDigest)
	if err != nil {
		return err
	}
	verifier, err := r.VerifyTOC(want)
	if err != nil {
		return fmt.Errorf("verify TOC: %w", err)
	}
	out := map[string]entry{}
	root, ok := r.Lookup("")
	if !ok {
		return fmt.Errorf("no root entry")
	}
	var walk func(dir string, e *estargz.TOCEntry) error
	walk = func(dir string, e *estargz.TOCEntry) error {
		var failed error
		e.ForeachChild(func(base string, child *estargz.TOCEntry) bool {
			name := path.Join(dir, base)
			got := entry{Type: child.Type, Size: child.Size, Mode: child.Mode, LinkName: child.LinkName, Digest: child.Digest}
			switch child.Type {
			case "reg":
				if child.Size == 0 { // the reader registers verifiers for data chunks only
					got.SHA256 = fmt.Sprintf("sha256:%x", sha256.Sum256(nil))
					break
				}
				if _, err := verifier.Verifier(child); err != nil {
					failed = fmt.Errorf("%s: verifier: %w", name, err)
					return false
				}
				sr, err := r.OpenFile(name)
				if err != nil {
					failed = fmt.Errorf("%s: %w", name, err)
					return false
				}
				h := sha256.New()
				if _, err := io.Copy(h, sr); err != nil {
					failed = fmt.Errorf("%s: read: %w", name, err)
					return false
				}
				got.SHA256 = fmt.Sprintf("sha256:%x", h.Sum(nil))
			case "dir":
				if err := walk(name, child); err != nil {
					failed = err
					return false
				}
			}
			out[name] = got
			return true
		})
		return failed
	}
	if err := walk("", root); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"tocDigest": r.TOCDigest().String(), "entries": out})
}
