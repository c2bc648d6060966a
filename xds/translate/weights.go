package translate

import (
	"maps"
	"math"
	"slices"
	"sort"
)

// WeightTotal is what the integer weights of a split always sum to: parts per
// million, so a weight of 0.000001 is still honoured.
const WeightTotal = 1_000_000

// clusterWeight is one backend's integer share of an endpoint's traffic.
type clusterWeight struct {
	Backend string
	Weight  uint32
}

// splitWeights turns float weights that sum to 1 into integer weights that sum
// exactly to WeightTotal, by the largest-remainder method. Backends with weight
// 0 are left out; every backend with a weight above 0 gets at least 1, so no
// such backend loses all its traffic to rounding. Ties go by backend name.
func splitWeights(traffic map[string]float64) []clusterWeight {
	type part struct {
		name  string
		floor int64
		frac  float64
	}
	var parts []part
	var sum float64
	for _, w := range traffic {
		sum += w
	}
	var assigned int64
	for _, name := range slices.Sorted(maps.Keys(traffic)) {
		w := traffic[name]
		if w <= 0 {
			continue
		}
		exact := w / sum * WeightTotal // normalise away the tolerated 1e-8 error
		floor := int64(math.Floor(exact))
		if floor < 1 {
			floor = 1
		}
		parts = append(parts, part{name: name, floor: floor, frac: exact - math.Floor(exact)})
		assigned += floor
	}
	// Hand out what is left, largest remainder first.
	order := make([]int, len(parts))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return parts[order[a]].frac > parts[order[b]].frac })
	for i := 0; assigned < WeightTotal; i = (i + 1) % len(parts) {
		parts[order[i]].floor++
		assigned++
	}
	// Minimums of 1 can overshoot: take the excess from the largest shares.
	sort.SliceStable(order, func(a, b int) bool { return parts[order[a]].floor > parts[order[b]].floor })
	for i := 0; assigned > WeightTotal; i = (i + 1) % len(parts) {
		if parts[order[i]].floor > 1 {
			parts[order[i]].floor--
			assigned--
		}
	}
	out := make([]clusterWeight, len(parts))
	for i, p := range parts {
		out[i] = clusterWeight{Backend: p.name, Weight: uint32(p.floor)}
	}
	return out
}

// fractionPPM turns a proportion in [0, 1] into parts per million; a
// proportion above 0 never rounds down to nothing.
func fractionPPM(p float64) uint32 {
	ppm := uint32(math.Round(p * WeightTotal))
	if ppm == 0 && p > 0 {
		return 1
	}
	return ppm
}
