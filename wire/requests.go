package wire

// Headers of a request's criticality and priority: a client may send the
// first two, the routes set the third on every request, and the pickers
// read all three.
const (
	// CriticalityHeader carries a request's criticality (Critical or
	// Sheddable); without it, the request is its endpoint's.
	CriticalityHeader = "x-servemesh-criticality"
	// PriorityHeader carries the priority a request asks for, an integer;
	// it counts only up to what its endpoint allows.
	PriorityHeader = "x-servemesh-priority"
	// PriorityLimitHeader carries what the request's endpoint allows, set
	// by the route on every request (a client's own is replaced).
	PriorityLimitHeader = "x-servemesh-priority-limit"
	// TTFTObjectiveHeader carries, in milliseconds, the time to first
	// token a request aims for: its deadline, counted from when the
	// picker of its replica's node gets it. Honoured from inside the mesh
	// only: the public listener removes a client's own.
	TTFTObjectiveHeader = "x-servemesh-ttft-objective-ms"
)

// MaxTTFTObjectiveMS bounds what TTFTObjectiveHeader may ask for; more
// counts as no objective.
const MaxTTFTObjectiveMS = 600_000

// Criticalities, as CriticalityHeader carries them.
const (
	Critical  = "critical"
	Sheddable = "sheddable"
)

// DefaultModelField is the body field that names a request's model when
// an endpoint names none.
const DefaultModelField = "model"

// MaxRateLimitKeys is how many values of a rate limit's header a node
// keeps a bucket for at once.
const MaxRateLimitKeys = 10_000
