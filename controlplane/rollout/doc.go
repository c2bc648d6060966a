// Package rollout runs progressive delivery: it judges every endpoint's
// rollout (meshspec.Rollout) from the figures the nodes' Envoys count, and
// moves it on through the controller. In the flow of docs/architecture.md:
// step 12.
//
//   - Each second it takes the agents' latest loads (read by
//     controlplane/autoscale, step 11): per backend, requests, 5xx answers
//     and the request-time histogram, counted by Envoy.
//   - For the current stage of each progressing rollout it keeps a window:
//     every node's counters when the stage began (or when this controller
//     first saw it), so the stage's figures are the latest less those,
//     summed over nodes, for the candidate and the primary alike.
//   - Judge compares them with the checks: a failed check decides at once
//     (given a minimum sample), a pass needs the stage's duration and
//     minimum of requests too.
//   - A verdict goes through the controller (JudgeRollout, step 2), which
//     records it and sets the next stage's traffic in one checkpoint, naming
//     the stage it judged: a controller that crashes after it and the one
//     that takes over never judge a stage twice. Followers keep windows
//     too, so one that takes over judges over what it has seen; a
//     controller that starts afresh opens a new window (the counts live in
//     the Envoys), while the stage's clock, stored, goes on.
package rollout
