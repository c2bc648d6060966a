// Package e2e holds servemesh's end-to-end tests. They run the real Envoy
// (from `make tools`) and the real servemesh binary, built once per run, and
// send real HTTP traffic on loopback. A missing Envoy fails the run; nothing
// here is skipped.
//
// Every test runs beside others (t.Parallel; make test runs TEST_PARALLEL
// at once), so each shares nothing with another:
//   - its own Consul, controllers, agents, Envoys and replicas, stopped by
//     its cleanups (TestMain fails the run if any process is left);
//   - its own folders (t.TempDir) and ports from proc.FreeAddr, which
//     never hands a port out twice in a minute to any process here (the
//     demo stack and the agents it starts included) and draws them from
//     below the kernel's ephemeral range, so no kernel-chosen port
//     (Jaeger's, an outgoing connection's) takes one first;
//   - nodes on 127.0.0.2 and 127.0.0.3 (twoNodeMesh) with such ports;
//   - a test whose daemons need fixed ports (Consul's defaults in a
//     cluster) has loopback addresses no other test uses:
//     TestConsulCluster 127.0.0.4 and 127.0.0.10-12 (its client agents on
//     127.0.0.2 and .3 take Consul's default ports, below the kernel's
//     range), TestDeployWalkthrough 127.0.0.50-71,
//     TestExportRoundTripsAndABackupRestores
//     127.0.0.90-91.
//
// A test that needs the machine to itself (exclusive timing, a fixed
// resource another test uses) leaves out t.Parallel and its doc comment
// says "Runs alone:" and why (docs/e2e_test.go holds every test to this):
// go test runs such tests alone, before the parallel ones.
// TestNodeLossAtScale does (20 Envoys: the kernel's per-user inotify
// instances).
package e2e
