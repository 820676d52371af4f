#!/usr/bin/env bash
# Starts and stops a throw-away etcd for tests and drills: one member on
# 127.0.0.1, free ports, data in DIR (a temporary folder the caller owns).
#
#   scripts/etcd.sh start DIR   prints the client endpoint (127.0.0.1:PORT)
#                               once etcd answers; its pid is DIR/etcd.pid
#   scripts/etcd.sh start-tls DIR
#                               the same over https with client
#                               certificates (--client-cert-auth) and etcd
#                               auth on: a CA, a server certificate and
#                               client certificates in DIR/tls (with the
#                               etcd user root's name and password in
#                               user and password) and DIR/tls-nobody
#                               (no etcd user): ca.crt, client.crt,
#                               client.key, as kvferry's etcd_tls_dir reads
#   scripts/etcd.sh stop DIR    stops it (SIGTERM, then SIGKILL after 3 s)
#   scripts/etcd.sh have        exit 0 if etcd is installed, 77 if not
#
# Exit 77 (skip) when etcd is not installed, 1 when it does not start
# within 10 s (its log is DIR/etcd.log).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
etcd_bin=$(command -v etcd || true)
[ -n "$etcd_bin" ] || [ ! -x /usr/bin/etcd ] || etcd_bin=/usr/bin/etcd

# certs DIR: a CA, a server certificate for 127.0.0.1 (also a client
# one: etcd's gateway calls etcd with it), and two client certificates
# without a common name (etcd's JSON gateway refuses one that has a CN
# when auth is on): DIR/tls and DIR/tls-nobody
certs() {
  local d=$1 sub
  mkdir -p "$d/tls" "$d/tls-nobody"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=kvf-test-ca \
    -keyout "$d/tls/ca.key" -out "$d/tls/ca.crt" >/dev/null 2>&1
  cp "$d/tls/ca.crt" "$d/tls-nobody/ca.crt"
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' \
    >"$d/tls/server.ext"
  openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 \
    -keyout "$d/tls/server.key" -out "$d/tls/server.csr" >/dev/null 2>&1
  openssl x509 -req -in "$d/tls/server.csr" -CA "$d/tls/ca.crt" \
    -CAkey "$d/tls/ca.key" -CAcreateserial -days 2 \
    -extfile "$d/tls/server.ext" -out "$d/tls/server.crt" >/dev/null 2>&1
  for sub in tls tls-nobody; do
    printf 'extendedKeyUsage=clientAuth\n' >"$d/$sub/client.ext"
    openssl req -newkey rsa:2048 -nodes -subj "/O=kvferry-$sub" \
      -keyout "$d/$sub/client.key" -out "$d/$sub/client.csr" >/dev/null 2>&1
    openssl x509 -req -in "$d/$sub/client.csr" -CA "$d/tls/ca.crt" \
      -CAkey "$d/tls/ca.key" -CAcreateserial -days 2 \
      -extfile "$d/$sub/client.ext" -out "$d/$sub/client.crt" >/dev/null 2>&1
  done
  # etcdctl: a certificate of its own, CN root (the gRPC API takes it)
  printf 'extendedKeyUsage=clientAuth\n' >"$d/tls/root.ext"
  openssl req -newkey rsa:2048 -nodes -subj /CN=root \
    -keyout "$d/tls/root.key" -out "$d/tls/root.csr" >/dev/null 2>&1
  openssl x509 -req -in "$d/tls/root.csr" -CA "$d/tls/ca.crt" \
    -CAkey "$d/tls/ca.key" -CAcreateserial -days 2 \
    -extfile "$d/tls/root.ext" -out "$d/tls/root.crt" >/dev/null 2>&1
  chmod 600 "$d"/tls*/*.key
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

case "$cmd" in
  have)
    [ -n "$etcd_bin" ] || exit 77
    ;;
  start|start-tls)
    [ -n "$etcd_bin" ] || { echo "etcd.sh: etcd is not installed (scripts/setup.sh installs it)" >&2; exit 77; }
    [ -n "$dir" ] || { echo "etcd.sh: start needs a folder" >&2; exit 2; }
    mkdir -p "$dir"
    cport=$(free_port)
    pport=$(free_port)
    while [ "$pport" = "$cport" ]; do pport=$(free_port); done
    scheme=http tlsargs=()
    if [ "$cmd" = start-tls ]; then
      certs "$dir"
      scheme=https
      tlsargs=(--cert-file "$dir/tls/server.crt" --key-file "$dir/tls/server.key"
               --trusted-ca-file "$dir/tls/ca.crt" --client-cert-auth)
    fi
    "$etcd_bin" --name kvf-test --data-dir "$dir/data" \
      --listen-client-urls "$scheme://127.0.0.1:$cport" \
      --advertise-client-urls "$scheme://127.0.0.1:$cport" "${tlsargs[@]}" \
      --listen-peer-urls "http://127.0.0.1:$pport" \
      --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
      --initial-cluster "kvf-test=http://127.0.0.1:$pport" \
      --heartbeat-interval 20 --election-timeout 200 \
      --log-level error >"$dir/etcd.log" 2>&1 &
    echo $! >"$dir/etcd.pid"
    for _ in $(seq 100); do
      if python3 -c 'import sys, ssl, urllib.request as u
c = None
if sys.argv[2]:
    c = ssl.create_default_context(cafile=sys.argv[2] + "/ca.crt")
    c.load_cert_chain(sys.argv[2] + "/client.crt", sys.argv[2] + "/client.key")
u.urlopen(u.Request(sys.argv[1], data=b"{\"key\":\"AA==\"}"), timeout=1,
          context=c)' "$scheme://127.0.0.1:$cport/v3/kv/range" \
           "$([ "$scheme" = https ] && echo "$dir/tls")" >/dev/null 2>&1; then
        if [ "$cmd" = start-tls ]; then
          # etcd auth on: the user root (every right), known by its
          # certificate's CN
          ctl=(etcdctl --endpoints "https://127.0.0.1:$cport"
               --cacert "$dir/tls/ca.crt" --cert "$dir/tls/root.crt"
               --key "$dir/tls/root.key")
          head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/tls/password"
          chmod 600 "$dir/tls/password"
          echo root >"$dir/tls/user"
          "${ctl[@]}" user add root:"$(cat "$dir/tls/password")" \
            --interactive=false >>"$dir/etcd.log" 2>&1 &&
          "${ctl[@]}" user grant-role root root >>"$dir/etcd.log" 2>&1 &&
          "${ctl[@]}" auth enable >>"$dir/etcd.log" 2>&1 || break
        fi
        echo "127.0.0.1:$cport"
        exit 0
      fi
      kill -0 "$(cat "$dir/etcd.pid")" 2>/dev/null || break
      sleep 0.1
    done
    echo "etcd.sh: etcd did not start; last lines of $dir/etcd.log:" >&2
    tail -n 5 "$dir/etcd.log" >&2 || true
    kill "$(cat "$dir/etcd.pid")" 2>/dev/null || true
    exit 1
    ;;
  stop)
    [ -f "$dir/etcd.pid" ] || exit 0
    pid=$(cat "$dir/etcd.pid")
    kill -CONT "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 30); do
      kill -0 "$pid" 2>/dev/null || { rm -f "$dir/etcd.pid"; exit 0; }
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/etcd.pid"
    ;;
  *)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
