#!/usr/bin/env bash
# Makes a CA and one certificate for the processes of a cluster (controller, workers, and clients
# that present one), for --tls-cert/--tls-key/--tls-ca and PW_TLS_CA/PW_TLS_CERT/PW_TLS_KEY:
#   DIR/ca.pem  DIR/ca-key.pem  DIR/cert.pem  DIR/key.pem   (keys 0600)
# NAMEs: the DNS names and IP addresses the certificate is valid for, as peers dial them
# (default: localhost 127.0.0.1). Usage: scripts/tls-certs.sh DIR [NAME...]
# For production, use your organisation's CA; this is for a cluster of your own and for tests.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [NAME...]" >&2; exit 2; }
dir=$1
shift
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(localhost 127.0.0.1)
san=""
for n in "${names[@]}"; do
  if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san+="${san:+,}IP:$n"; else san+="${san:+,}DNS:$n"; fi
done
mkdir -p "$dir"
umask 077
curve=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${curve[@]}" -days 825 -subj "/CN=pathways cluster CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null
openssl req "${curve[@]}" -subj "/CN=pathways" -keyout "$dir/key.pem" -out "$dir/cert.csr" \
  2>/dev/null
openssl x509 -req -in "$dir/cert.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
  -set_serial "0x$(openssl rand -hex 8)" -days 825 -out "$dir/cert.pem" \
  -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san") \
  2>/dev/null
rm -f "$dir/cert.csr"
chmod 0644 "$dir/ca.pem" "$dir/cert.pem"
