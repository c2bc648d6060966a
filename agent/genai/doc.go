// Package genai keeps a node's GenAI signals (wire/genai.go): the node's
// Envoy reads each answer of an endpoint that serves model traffic as it
// passes (its time to first byte, the mean time between its tokens, its
// tokens and model) and sends the entry to this package's access log
// service, on a socket in its folder. The Recorder keeps them as
// Prometheus histograms per endpoint, backend and model (OpenTelemetry's
// gen_ai.server.time_to_first_token and time_per_output_token, in
// seconds, and a token counter) and, per backend, as the finer cumulative
// histograms the node's Load reports, which rollouts judge a candidate
// by. It owns nothing else: the answers are read in Envoy, the verdicts
// made by the controller.
//
// In the flow of docs/architecture.md: step 9.
package genai
