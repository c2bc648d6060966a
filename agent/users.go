package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/servemesh/servemesh/envoy"
)

// UIDRange is a range of user ids, each of which is also a group id, that
// replicas run as: every backend gets one of its own on a node, so the
// replicas of one backend cannot read another's /proc/<pid>/environ (its
// secrets), enter its folder, or signal it. The ids need no entry in
// /etc/passwd; ids that have one are skipped.
type UIDRange struct {
	First, Count uint32
}

// DefaultUIDs is the range replicas run from when the agent runs as root
// and neither --run-as nor --replica-uids is given: high enough to miss
// the users and subordinate ranges of a usual host.
var DefaultUIDs = UIDRange{First: 1_000_000_000, Count: 100_000}

// String is the range as the flag takes it.
func (r UIDRange) String() string {
	return fmt.Sprintf("%d-%d", r.First, r.First+r.Count-1)
}

// ParseUIDRange reads "FIRST-LAST", the flag's form.
func ParseUIDRange(s string) (UIDRange, error) {
	first, last, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseUint(strings.TrimSpace(first), 10, 32)
	b, err2 := strconv.ParseUint(strings.TrimSpace(last), 10, 32)
	switch {
	case !ok || err1 != nil || err2 != nil:
		return UIDRange{}, fmt.Errorf("--replica-uids %q: write the range as FIRST-LAST, such as %s", s, DefaultUIDs)
	case a < 1000 || b < a || b >= 1<<31:
		return UIDRange{}, fmt.Errorf("--replica-uids %q: the range must be ordered and within 1000-%d (system users are below 1000); such as %s", s, 1<<31-1, DefaultUIDs)
	}
	return UIDRange{First: uint32(a), Count: uint32(b-a) + 1}, nil
}

// backendUsers gives each backend its uid from a range, kept in a file of
// the work folder so that the next agent (which adopts the replicas, and
// whose replicas' folders are owned by those ids) gives the same.
type backendUsers struct {
	r    UIDRange
	path string

	mu    sync.Mutex
	by    map[string]uint32 // backend: uid
	taken map[uint32]bool
}

const usersFile = "backend-uids.json"

// loadBackendUsers reads the ids given so far in workDir.
func loadBackendUsers(r UIDRange, workDir string) (*backendUsers, error) {
	u := &backendUsers{r: r, path: filepath.Join(workDir, usersFile), by: map[string]uint32{}, taken: map[uint32]bool{}}
	b, err := os.ReadFile(u.path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("the backends' user ids: %w", err)
	}
	if err == nil {
		if err := json.Unmarshal(b, &u.by); err != nil {
			return nil, fmt.Errorf("the backends' user ids in %s: %w; remove the file once no replica runs", u.path, err)
		}
	}
	for _, id := range u.by {
		u.taken[id] = true
	}
	return u, nil
}

// credential is the user and group the replicas of backend run as, with
// no supplementary groups.
func (u *backendUsers) credential(backend string) (*syscall.Credential, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	id, ok := u.by[backend]
	if !ok {
		var err error
		if id, err = u.next(); err != nil {
			return nil, err
		}
		if err := u.give(backend, id); err != nil {
			return nil, err
		}
	}
	return &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{}}, nil
}

// give records that backend's replicas run as id, undone if it cannot be
// saved; called with mu held.
func (u *backendUsers) give(backend string, id uint32) error {
	u.by[backend], u.taken[id] = id, true
	if err := u.save(); err != nil {
		delete(u.by, backend)
		delete(u.taken, id)
		return fmt.Errorf("recording backend %s's user id: %w", backend, err)
	}
	return nil
}

// claim records that backend's replicas run as uid (a running replica's,
// adopted), unless uid is outside the range (a user an agent of another
// release or with other flags gave). It refuses a uid that another
// backend has, or another uid than backend has: such a replica could read
// another backend's processes and files.
func (u *backendUsers) claim(backend string, uid uint32) error {
	if uid < u.r.First || uid-u.r.First >= u.r.Count {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if had, ok := u.by[backend]; ok {
		if had != uid {
			return fmt.Errorf("backend %s's replicas run as user %d, and this one as %d", backend, had, uid)
		}
		return nil
	}
	for other, id := range u.by {
		if id == uid {
			return fmt.Errorf("it runs as user %d, which is backend %s's, not %s's", uid, other, backend)
		}
	}
	return u.give(backend, uid)
}

// retiredPrefix keys, in the users file, an id whose backend was deleted:
// it is never given again, so a backend created later under the same name
// cannot read what the old one's replicas left (files, shared memory) as
// that user. No backend name starts with '-', and an agent of an earlier
// release reads the entry as a backend's and leaves its id taken too.
const retiredPrefix = "-retired-"

// retire takes back the ids of the backends not in keep (deleted, with no
// replica left on the node), never to give them again.
func (u *backendUsers) retire(keep map[string]bool) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	var gone []string
	for backend := range u.by {
		if !keep[backend] && !strings.HasPrefix(backend, retiredPrefix) {
			gone = append(gone, backend)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	for _, backend := range gone {
		id := u.by[backend]
		delete(u.by, backend)
		u.by[retiredPrefix+strconv.FormatUint(uint64(id), 10)] = id
	}
	if err := u.save(); err != nil {
		return fmt.Errorf("retiring the user ids of deleted backends %v: %w", gone, err)
	}
	return nil
}

// save writes the ids given so far, atomically; called with mu held.
func (u *backendUsers) save() error {
	b, err := json.Marshal(u.by)
	if err != nil {
		return err
	}
	return envoy.ReplaceFile(u.path, b)
}

// next is the first id of the range that no backend has and no user of
// the host has; called with mu held.
func (u *backendUsers) next() (uint32, error) {
	for i := uint32(0); i < u.r.Count; i++ {
		id := u.r.First + i
		if u.taken[id] {
			continue
		}
		if _, err := user.LookupId(strconv.FormatUint(uint64(id), 10)); err == nil {
			continue
		}
		if _, err := user.LookupGroupId(strconv.FormatUint(uint64(id), 10)); err == nil {
			continue
		}
		return id, nil
	}
	return 0, fmt.Errorf("--replica-uids %s: every id is taken by a backend or a user of this host; give a larger range", u.r)
}
