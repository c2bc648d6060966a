package picker

import "container/list"

// maxSessions bounds the conversations a picker remembers, least recently
// seen forgotten first: 65,536, about 8 MB.
const maxSessions = 65536

// sessions is which replica (by tag) served each conversation last, by
// backend and session, least recently seen first to go. Not safe for
// concurrent use: the picker's lock holds it.
type sessions struct {
	order *list.List // of *session, most recent first
	at    map[sessionKey]*list.Element
}

type sessionKey struct{ backend, id string }

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
	if e, ok := s.at[sessionKey{backend, id}]; ok {
		return e.Value.(*session).tag
	}
	return ""
}

// served records that tag served the conversation.
func (s *sessions) served(backend, id, tag string) {
	k := sessionKey{backend, id}
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
