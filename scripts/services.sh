#!/usr/bin/env bash
# Make sure every server the tests talk to is reachable; start one that is not.
# Fails naming exactly what is missing. The commands are this machine's own service starters.
set -u

check() {  # host port
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && exec 3>&- 3<&-
}

ensure() {  # name port needed-program start-command...
  local name=$1 port=$2 needs=$3; shift 3
  if check 127.0.0.1 "$port"; then
    echo "services: $name is up on 127.0.0.1:$port"
    return 0
  fi
  echo "services: $name is not reachable on 127.0.0.1:$port; starting it: $*"
  if ! command -v "$needs" >/dev/null 2>&1; then
    echo "services: cannot start $name: '$needs' is not installed on this machine" >&2
    return 1
  fi
  "$@" >/dev/null 2>&1 || true
  for _ in $(seq 1 60); do
    if check 127.0.0.1 "$port"; then
      echo "services: $name started on 127.0.0.1:$port"
      return 0
    fi
    sleep 1
  done
  echo "services: $name did not come up on 127.0.0.1:$port within 60 s (tried: $*)" >&2
  return 1
}

failed=0
bash "$(dirname "$0")/test-tools.sh" || failed=1
ensure PostgreSQL 5432 pg_ctlcluster bash -c \
  'pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start' || failed=1
ensure Redis 6379 redis-server redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
  --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log || failed=1
ensure RabbitMQ 5672 rabbitmq-server rabbitmq-server -detached || failed=1
# Per-tenant order over partitions (ingress ?partitions=N) uses RabbitMQ's consistent-hash
# exchange, shipped with the broker but not enabled by default; enabling it is online.
if check 127.0.0.1 5672 && command -v rabbitmq-plugins >/dev/null 2>&1; then
  if rabbitmq-plugins list -e -m 2>/dev/null | grep -qx rabbitmq_consistent_hash_exchange; then
    echo "services: RabbitMQ plugin rabbitmq_consistent_hash_exchange is enabled"
  elif rabbitmq-plugins enable rabbitmq_consistent_hash_exchange >/dev/null 2>&1; then
    echo "services: RabbitMQ plugin rabbitmq_consistent_hash_exchange enabled"
  else
    echo "services: could not enable RabbitMQ plugin rabbitmq_consistent_hash_exchange;" \
      "the partitioned ingress tests will skip" >&2
  fi
fi
ensure NATS 4222 /usr/sbin/nats-server start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server \
  -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log || failed=1

if [ "$failed" != 0 ]; then
  echo "services: some servers the tests need are missing (see above)" >&2
  exit 1
fi
