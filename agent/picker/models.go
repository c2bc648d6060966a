package picker

import (
	"container/list"
	"encoding/json"
)

// models is what the picker expects a replica to have loaded of a
// backend whose replicas load models on demand: the models it sent there
// last, least recently used first to go, as the replica's own LRU drops
// them (Ray Serve's multiplexing). Not safe for concurrent use.
type models struct {
	order *list.List // of string, most recent first
	at    map[string]*list.Element
}

func newModels() *models { return &models{order: list.New(), at: map[string]*list.Element{}} }

// miss is what sending model costs the replica, holding at most capacity:
// 0 loaded, 1 loaded into room it has, 2 loaded in place of another.
func (m *models) miss(model string, capacity int) int {
	switch _, ok := m.at[model]; {
	case ok:
		return 0
	case m.order.Len() < capacity:
		return 1
	}
	return 2
}

// use records that model was sent to the replica, which holds at most
// capacity.
func (m *models) use(model string, capacity int) {
	if e, ok := m.at[model]; ok {
		m.order.MoveToFront(e)
		return
	}
	m.at[model] = m.order.PushFront(model)
	for m.order.Len() > max(capacity, 1) {
		last := m.order.Back()
		delete(m.at, last.Value.(string))
		m.order.Remove(last)
	}
}

// names are the models, most recent first (a picker's checkpoint; use
// them from the last to hold them again in the same order).
func (m *models) names() []string {
	out := make([]string, 0, m.order.Len())
	for e := m.order.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(string))
	}
	return out
}

// bodyModel is the "model" an OpenAI-style JSON body names, or "".
func bodyModel(body []byte) string {
	var req struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &req)
	return req.Model
}
