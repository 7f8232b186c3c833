package witness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/countersign/countersign/approval"
)

// File appends each checkpoint to a file as one JSON line (with the
// entries' short hashes, which name a rewritten entry) and syncs it to
// disk before Publish returns. Keep the file where the Redis
// administrator cannot write: another host, a volume mounted
// append-only (chattr +a), or object storage with retention.
type File struct {
	// Path is the file; created (mode 0600) when missing.
	Path string

	mu sync.Mutex // serialises appends of this process
}

// Name says which witness it is.
func (f *File) Name() string { return "file " + f.Path }

// Publish appends c as one JSON line and fsyncs.
func (f *File) Publish(ctx context.Context, c approval.Checkpoint) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	b = append(b, '\n')
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	fd, err := os.OpenFile(f.Path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, werr := fd.Write(b)
	serr := fd.Sync()
	cerr := fd.Close()
	return errors.Join(werr, serr, cerr)
}

// Last returns the newest checkpoint in the file (its last line), nil when
// the file is missing or empty: the checkpointer starts from it
// (store.WitnessLog), as it is outside Redis.
func (f *File) Last(ctx context.Context) (*approval.Checkpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cps, err := ReadFile(f.Path)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(cps) == 0) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &cps[len(cps)-1], nil
}

// ReadFile reads the checkpoints a File wrote (one JSON object a line;
// blank lines are skipped).
func ReadFile(path string) ([]approval.Checkpoint, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	cps, err := Read(fd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cps, nil
}

// Read reads checkpoints, one JSON object a line.
func Read(r io.Reader) ([]approval.Checkpoint, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20) // a line holds up to Every short hashes
	var out []approval.Checkpoint
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var c approval.Checkpoint
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		out = append(out, c)
	}
	return out, sc.Err()
}
