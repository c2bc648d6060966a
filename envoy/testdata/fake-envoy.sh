#!/bin/sh
# A stand-in for Envoy in unit tests. It answers --version like Envoy 1.40,
# records its arguments and pid, and on SIGTERM records that and exits 0 --
# unless FAKE_ENVOY_IGNORE_TERM is set, when it must be killed. With
# FAKE_ENVOY_CRASH set it prints a message and exits 1 at once.
if [ "$1" = "--version" ]; then
  echo ""
  echo "fake-envoy  version: 9e5580933739775e8bce696a57a2e1bc99368f23/${FAKE_ENVOY_VERSION:-1.40.0}/Clean/RELEASE/BoringSSL"
  exit 0
fi
state=${FAKE_ENVOY_STATE:?FAKE_ENVOY_STATE must name a folder}
# The trap goes first: tests signal as soon as the pid file appears.
if [ -n "$FAKE_ENVOY_IGNORE_TERM" ]; then
  trap '' TERM
else
  trap 'echo terminated > "$state/signal"; exit 0' TERM
fi
echo "$*" > "$state/args"
echo $$ > "$state/pid"
if [ -n "$FAKE_ENVOY_CRASH" ]; then
  echo "critical: fake envoy crashed on purpose"
  exit 1
fi
echo "fake envoy running"
while :; do sleep 0.05; done
