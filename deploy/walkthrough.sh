#!/usr/bin/env bash
# From bare hosts to a running mesh: the commands of deploy/README.md, in
# order. Each step says on which host it runs; give the hosts' addresses:
#
#   SERVERS="10.0.0.1 10.0.0.2 10.0.0.3"   # the Consul servers
#   CONTROLLERS="10.0.0.4 10.0.0.5"        # the servemesh controllers
#   NODES="10.0.0.6 10.0.0.7"              # the nodes: replicas and Envoy
#   WORK=/var/lib/servemesh-walkthrough    # a folder per host below it
#
# e2e TestDeployWalkthrough runs this script on one machine, every host a
# loopback address, so every daemon runs here (in the background, its pid
# in $WORK/<host>/<daemon>.pid): `walkthrough.sh up` brings the mesh up and
# serves a backend through it; `walkthrough.sh down` takes it down, a node
# the way a node is removed. On real hosts, run each host's commands there,
# and the daemons under systemd (deploy/systemd).
set -euo pipefail
: "${SERVERS:?name the addresses of the Consul servers}" "${CONTROLLERS:?name the addresses of the controllers}" "${NODES:?name the addresses of the nodes}" "${WORK:?name a work folder}"
CONSUL=${CONSUL:-consul}
SERVEMESH=${SERVEMESH:-servemesh}
read -r -a servers <<<"$SERVERS"
read -r -a controllers <<<"$CONTROLLERS"
read -r -a nodes <<<"$NODES"

# start HOST NAME COMMAND...: a daemon in the background, in a session of
# its own, logging to $WORK/HOST/NAME.log (systemd's job on real hosts).
start() {
	local host=$1 name=$2
	shift 2
	mkdir -p "$WORK/$host"
	setsid "$@" >"$WORK/$host/$name.log" 2>&1 </dev/null &
	echo $! >"$WORK/$host/$name.pid"
}

# until WHAT COMMAND...: retry COMMAND for a minute.
until_ok() {
	local what=$1
	shift
	for _ in $(seq 300); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.2
	done
	echo "walkthrough: timed out waiting for $what" >&2
	return 1
}

consul_node() { echo "consul-${1//./-}"; } # a host's Consul node name

# consul_agent HOST [server]: one Consul agent: ACLs on with default deny,
# Connect on (servers), joined to the servers; its HTTP API on the host's
# address (on real hosts: 127.0.0.1, so a node registers only on its own).
consul_agent() {
	local host=$1 role=${2:-client} joins=""
	for s in "${servers[@]}"; do joins+="\"$s\", "; done
	mkdir -p "$WORK/$host/consul-data"
	cat >"$WORK/$host/consul.hcl" <<EOF
node_name = "$(consul_node "$host")"
data_dir = "$WORK/$host/consul-data"
bind_addr = "$host"
client_addr = "$host"
retry_join = [${joins%, }]
ports { dns = -1, grpc = -1 }
disable_update_check = true
log_level = "warn"
acl { enabled = true, default_policy = "deny", enable_token_persistence = true }
EOF
	if [ "$role" = server ]; then
		printf 'server = true\nbootstrap_expect = %d\nconnect { enabled = true }\n' "${#servers[@]}" >>"$WORK/$host/consul.hcl"
	fi
	start "$host" consul "$CONSUL" agent -config-file "$WORK/$host/consul.hcl"
}

# agent_token HOST: give the Consul agent on HOST a token of its own node
# identity, which it registers itself with.
agent_token() {
	local host=$1 token
	token=$(CONSUL_HTTP_ADDR=$host:8500 "$CONSUL" acl token create -description "consul agent $host" \
		-node-identity "$(consul_node "$host"):dc1" -format json | sed -n 's/.*"SecretID": "\(.*\)".*/\1/p')
	until_ok "the Consul agent on $host" env CONSUL_HTTP_ADDR="$host:8500" "$CONSUL" acl set-agent-token agent "$token"
}

# secret FILE: a random token in FILE, readable by its owner alone.
secret() { (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"); }

up() {
	# 1. On each Consul server: start Consul, then bootstrap its ACLs once
	#    (the management token goes to a safe place, not to servemesh).
	for s in "${servers[@]}"; do consul_agent "$s" server; done
	export CONSUL_HTTP_ADDR=${servers[0]}:8500
	local boot="" # the bootstrap succeeds once the servers elected a leader
	for _ in $(seq 200); do
		if boot=$("$CONSUL" acl bootstrap -format json 2>/dev/null); then break; fi
		sleep 0.3
	done
	[ -n "$boot" ] || { echo "walkthrough: the Consul servers elected no leader" >&2; return 1; }
	export CONSUL_HTTP_TOKEN
	CONSUL_HTTP_TOKEN=$(echo "$boot" | sed -n 's/.*"SecretID": "\(.*\)".*/\1/p')
	(umask 077 && echo "$CONSUL_HTTP_TOKEN" >"$WORK/consul-management.token")
	for s in "${servers[@]}"; do agent_token "$s"; done

	# 2. On every controller and node host: a Consul client agent.
	for h in "${controllers[@]}" "${nodes[@]}"; do consul_agent "$h"; done
	for h in "${controllers[@]}" "${nodes[@]}"; do
		until_ok "the Consul client on $h to join" env CONSUL_HTTP_ADDR="$h:8500" "$CONSUL" members
		agent_token "$h"
	done

	# 3. servemesh's Consul policies and a token for each daemon
	#    (deploy/consul/README.md says what each may do).
	local policies=${POLICIES:-$(dirname "$0")/consul}
	"$CONSUL" acl policy create -name servemesh-node -rules @"$policies/node-policy.hcl" >/dev/null
	for c in "${controllers[@]}"; do
		sed "s/NODE/$(consul_node "$c")/" "$policies/controller-policy.hcl" >"$WORK/$c/controller-policy.hcl"
		"$CONSUL" acl policy create -name "servemesh-controller-$(consul_node "$c")" -rules @"$WORK/$c/controller-policy.hcl" >/dev/null
		"$CONSUL" acl token create -description "servemesh controller $c" -policy-name "servemesh-controller-$(consul_node "$c")" -format json |
			(umask 077 && sed -n 's/.*"SecretID": "\(.*\)".*/\1/p' >"$WORK/$c/consul.token")
	done
	local i=0
	for n in "${nodes[@]}"; do
		i=$((i + 1))
		"$CONSUL" acl token create -description "servemesh node n$i" -policy-name servemesh-node \
			-node-identity "$(consul_node "$n"):dc1" -service-identity "servemesh-node-n$i" -format json |
			(umask 077 && sed -n 's/.*"SecretID": "\(.*\)".*/\1/p' >"$WORK/$n/consul.token")
	done

	# 4. The API's tokens (one per scope) and TLS certificate, on every
	#    controller; the agents' status token on every host.
	mkdir -p "$WORK/shared"
	for scope in exec write read agent-status; do secret "$WORK/shared/$scope.token"; done
	local sans="" c
	for c in "${controllers[@]}"; do sans+="IP:$c,"; done
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 -subj /CN=servemesh-api \
		-addext "subjectAltName=${sans%,}" -keyout "$WORK/shared/api-key.pem" -out "$WORK/shared/api.pem" 2>/dev/null
	chmod 600 "$WORK/shared/api-key.pem"

	# 5. On each controller host: the controller (servemesh-controller.service).
	local xds="" api=""
	i=0
	for c in "${controllers[@]}"; do
		i=$((i + 1))
		xds+="$c:18000,"
		api+="https://$c:18001,"
		start "$c" controller env CONSUL_HTTP_ADDR="$c:8500" CONSUL_HTTP_TOKEN="$(cat "$WORK/$c/consul.token")" \
			"$SERVEMESH" controller --id "c$i" --api-listen "$c:18001" --xds-listen "$c:18000" \
			--api-tls-cert "$WORK/shared/api.pem" --api-tls-key "$WORK/shared/api-key.pem" \
			--token-file "$WORK/shared/exec.token" --write-token-file "$WORK/shared/write.token" \
			--read-token-file "$WORK/shared/read.token" --agent-token-file "$WORK/shared/agent-status.token"
	done
	export SERVEMESH_SERVER=${api%,} SERVEMESH_CA_FILE=$WORK/shared/api.pem SERVEMESH_TOKEN_FILE=$WORK/shared/exec.token
	until_ok "a controller to lead" "$SERVEMESH" status

	# 6. On each node: the agent (servemesh-agent.service); it runs the
	#    node's Envoy and the replicas placed on it, each backend's as a
	#    user of its own (--replica-uids).
	i=0
	for n in "${nodes[@]}"; do
		i=$((i + 1))
		start "$n" agent env CONSUL_HTTP_ADDR="$n:8500" CONSUL_HTTP_TOKEN="$(cat "$WORK/$n/consul.token")" \
			"$SERVEMESH" agent --node-id "n$i" --address "$n" --inbound "$n:21000" --xds "${xds%,}" \
			--public "$n:8080" --mesh "$n:15001" --work-dir "$WORK/$n/agent" \
			--status-token-file "$WORK/shared/agent-status.token" --metrics-listen "$n:21001" \
			--allow-command "$SERVEMESH"
	done

	# 7. What the operator grants each node: the scheduler takes no more,
	#    whatever its agent claims.
	i=0
	for n in "${nodes[@]}"; do
		i=$((i + 1))
		"$SERVEMESH" node policy "n$i" --cpus 2 --memory-mb 2048 --allow-command "$SERVEMESH" >/dev/null
	done

	# 8. From anywhere with the API's CA and a token: a backend and an
	#    endpoint, served by every node.
	until_ok "the nodes to register" "$SERVEMESH" backend create hello --command "$SERVEMESH" \
		--arg demo-replica --arg --backend --arg hello '--arg=--listen' '--arg=${HOST}:${PORT}' \
		--health-path / --num-replicas "${#nodes[@]}" --cpus 0.5
	"$SERVEMESH" endpoint create hello --route /hello --traffic hello=1 >/dev/null
	for n in "${nodes[@]}"; do
		until_ok "node $n to serve /hello" curl -sf "http://$n:8080/hello"
	done
	"$SERVEMESH" status
	echo "walkthrough: the mesh serves /hello on every node"
}

# down: remove each node (drain, stop the agent, stop what it left), then
# the controllers and Consul.
down() {
	export SERVEMESH_SERVER="" SERVEMESH_CA_FILE=$WORK/shared/api.pem SERVEMESH_TOKEN_FILE=$WORK/shared/exec.token
	local c api=""
	for c in "${controllers[@]}"; do api+="https://$c:18001,"; done
	SERVEMESH_SERVER=${api%,}
	local i=0 n
	for n in "${nodes[@]}"; do
		i=$((i + 1))
		stop "$n" agent
		CONSUL_HTTP_ADDR="$n:8500" CONSUL_HTTP_TOKEN="$(cat "$WORK/$n/consul.token" 2>/dev/null || true)" \
			"$SERVEMESH" agent --stop-all --stop-grace 1s --node-id "n$i" --work-dir "$WORK/$n/agent" || true
	done
	for c in "${controllers[@]}"; do stop "$c" controller; done
	for h in "${controllers[@]}" "${nodes[@]}" "${servers[@]}"; do stop "$h" consul; done
}

# stop HOST NAME: SIGTERM to a daemon started by start, SIGKILL after 10 s.
stop() {
	local pidfile=$WORK/$1/$2.pid pid
	[ -f "$pidfile" ] || return 0
	pid=$(cat "$pidfile")
	kill -TERM -- "-$pid" 2>/dev/null || true
	for _ in $(seq 50); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.2
	done
	kill -KILL -- "-$pid" 2>/dev/null || true
	rm -f "$pidfile"
}

case "${1:-}" in
up) up ;;
down) down ;;
*)
	echo "usage: walkthrough.sh up|down (with SERVERS, CONTROLLERS, NODES and WORK set)" >&2
	exit 2
	;;
esac
