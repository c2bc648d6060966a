package picker

import (
	"container/list"
	"crypto/sha256"
	"encoding/hex"
)

// maxSessions bounds the conversations a picker remembers, least recently
// seen forgotten first: 65,536, about 8 MB.
const maxSessions = 65536

// sessions is which replica (by tag) served each conversation last, by
// backend and session, least recently seen first to go. A session is
// held by a hash of its id (sessionHash), never the id a client sent,
// which the picker's checkpoint writes to disk. Not safe for concurrent
// use: the picker's lock holds it.
type sessions struct {
	order *list.List // of *session, most recent first
	at    map[sessionKey]*list.Element
}

type sessionKey struct{ backend, id string } // id: sessionHash

// sessionHash is what the picker holds of a session id: its SHA-256, in
// hex, cut to 128 bits.
func sessionHash(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:16])
}

type session struct {
	key sessionKey
	tag string
}

func newSessions() *sessions {
	return &sessions{order: list.New(), at: map[sessionKey]*list.Element{}}
}

// replica is the tag of the replica that served the conversation last,
// or "".
func (s *sessions) replica(backend, id string) string {
	if e, ok := s.at[sessionKey{backend, sessionHash(id)}]; ok {
		return e.Value.(*session).tag
	}
	return ""
}

// served records that tag served the conversation.
func (s *sessions) served(backend, id, tag string) {
	s.put(sessionKey{backend, sessionHash(id)}, tag)
}

// put records that tag served the session of key k.
func (s *sessions) put(k sessionKey, tag string) {
	if e, ok := s.at[k]; ok {
		e.Value.(*session).tag = tag
		s.order.MoveToFront(e)
		return
	}
	s.at[k] = s.order.PushFront(&session{key: k, tag: tag})
	for s.order.Len() > maxSessions {
		last := s.order.Back()
		delete(s.at, last.Value.(*session).key)
		s.order.Remove(last)
	}
}

// savedSession is a session as the picker's checkpoint holds it.
type savedSession struct {
	Backend string `json:"backend"`
	Hash    string `json:"hash"` // sessionHash of its id
	Replica string `json:"replica"`
}

// saved are the sessions, most recently seen first.
func (s *sessions) saved() []savedSession {
	out := make([]savedSession, 0, s.order.Len())
	for e := s.order.Front(); e != nil; e = e.Next() {
		v := e.Value.(*session)
		out = append(out, savedSession{Backend: v.key.backend, Hash: v.key.id, Replica: v.tag})
	}
	return out
}

// restore records saved, most recently seen first, as saved gave them.
func (s *sessions) restore(saved []savedSession) {
	for i := len(saved) - 1; i >= 0; i-- {
		if v := saved[i]; v.Backend != "" && v.Hash != "" && v.Replica != "" {
			s.put(sessionKey{v.Backend, v.Hash}, v.Replica)
		}
	}
}
