// Package autoscale sizes autoscaled backends from their load, as Ray
// Serve's autoscaling policy does. In the flow of docs/architecture.md:
// step 11.
//
//   - Poller reads every live agent's /v1/load: the figures its node's Envoy
//     counts (requests in flight, totals and 5xx per backend). Nothing is
//     counted in Go; Envoy is the source.
//   - For each autoscaled backend, the in-flight requests summed over all
//     nodes are kept for the look-back period.
//   - Policy turns their average into a replica count, ceil(avg / target),
//     within [min, max], and acts only when the need has lasted the upscale
//     (or, much longer, the downscale) delay: a steady load never flaps.
//   - A decision goes through the controller's checkpointed path
//     (Controller.Autoscale, step 2 of the flow), so it survives crashes and
//     shows in status.
package autoscale
