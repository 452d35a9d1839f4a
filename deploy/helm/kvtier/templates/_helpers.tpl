{{/* The release's name for its objects, at most 63 characters. */}}
{{- define "kvtier.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvtier.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvtier.labels" -}}
{{ include "kvtier.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Unix socket's path, the same in the daemon and the engines. */}}
{{- define "kvtier.socket" -}}
{{ .Values.socketDir }}/kvtier.sock
{{- end -}}

{{/* The memory the daemon is sized for, in MiB: its primaries and overhead. */}}
{{- define "kvtier.memoryMiB" -}}
{{- $engines := 0 -}}
{{- if .Values.engines.enabled -}}
{{- $engines = mul (int .Values.engines.primaryMiB) (int .Values.engines.expectedLayouts) -}}
{{- end -}}
{{- add (int .Values.primaryMiB) $engines (int .Values.memoryOverheadMiB) -}}
{{- end -}}

{{/* The environment variable holding tenant i's token. */}}
{{- define "kvtier.tenantTokenEnv" -}}
{{- printf "KVTIER_TENANT_TOKEN_%d" . -}}
{{- end -}}

{{/* The kvtier configuration, rendered from the values. */}}
{{- define "kvtier.config" -}}
{{- $v := .Values -}}
{{- $tiers := list -}}
{{- if $v.fs.enabled -}}
{{- $tiers = append $tiers (dict "name" "local-disk" "type" "fs" "root_dir" "/var/lib/kvtier/fs" "locality" "local" "max_bytes" $v.fs.maxBytes) -}}
{{- end -}}
{{- range $v.extraTiers -}}
{{- $tiers = append $tiers . -}}
{{- end -}}
{{- $server := dict "unix_socket" (include "kvtier.socket" .) "metrics_addr" (printf "0.0.0.0:%d" (int $v.metrics.port)) "shutdown_timeout" (printf "%ds" (int $v.shutdownTimeoutSeconds)) -}}
{{- if $v.api.tcp -}}
{{- $_ := required "api.tcp needs auth.secretName: the admin token's Secret" $v.auth.secretName -}}
{{- $_ = set $server "tcp_addr" (printf "0.0.0.0:%d" (int $v.api.port)) -}}
{{- $_ = set $server "stream_addr" (printf "0.0.0.0:%d" (int $v.api.streamPort)) -}}
{{- else -}}
{{- $_ := set $server "tcp_addr" "" -}}
{{- end -}}
{{- if $v.auth.secretName -}}
{{- $_ := set $server "auth_token_env" "KVTIER_AUTH_TOKEN" -}}
{{- end -}}
{{- if and $v.unixPeers (or $v.auth.secretName $v.tenants) -}}
{{- $_ := set $server "unix_peers" $v.unixPeers -}}
{{- end -}}
{{- if $v.tls.secretName -}}
{{- $t := dict "cert_file" "/etc/kvtier/tls/tls.crt" "key_file" "/etc/kvtier/tls/tls.key" -}}
{{- if $v.tls.clientCA -}}
{{- $_ := set $t "client_ca_file" "/etc/kvtier/tls/ca.crt" -}}
{{- end -}}
{{- $_ := set $server "tls" $t -}}
{{- end -}}
{{- $cfg := dict
  "namespace" (dict "model" $v.model "bytes_per_block" $v.blockBytes)
  "primary" (dict "bytes" (printf "%dMiB" (int $v.primaryMiB)) "arena" (dict "kind" "memfd"))
  "engines" (dict "enabled" $v.engines.enabled "primary_bytes" (printf "%dMiB" (int $v.engines.primaryMiB)) "max_namespaces" (int $v.engines.maxNamespaces))
  "secondary_tiers" $tiers
  "server" $server
-}}
{{- if $v.events.enabled -}}
{{- $_ := set $cfg "events" (dict "enabled" true "endpoint" (printf "tcp://*:%d" (int $v.events.port)) "mode" "bind" "self_describing" $v.events.selfDescribing) -}}
{{- end -}}
{{- if $v.tenants -}}
{{- $ts := list -}}
{{- range $i, $t := $v.tenants -}}
{{- $_ := required (printf "tenants[%d].tokenSecret.name: the tenant's token comes from a Secret" $i) (dig "tokenSecret" "name" "" $t) -}}
{{- $e := dict "name" $t.name "token_env" (include "kvtier.tenantTokenEnv" $i) "namespaces" $t.namespaces -}}
{{- if $t.quota }}{{ $_ := set $e "quota" $t.quota }}{{ end -}}
{{- if $t.weight }}{{ $_ := set $e "weight" $t.weight }}{{ end -}}
{{- if $t.eventSalt }}{{ $_ := set $e "event_salt" $t.eventSalt }}{{ end -}}
{{- if $t.clientCertCN }}{{ $_ := set $e "client_cert_cn" $t.clientCertCN }}{{ end -}}
{{- $ts = append $ts $e -}}
{{- end -}}
{{- $_ := set $cfg "tenants" $ts -}}
{{- end -}}
{{- if $v.sharedSpaces -}}
{{- $_ := set $cfg "shared_spaces" $v.sharedSpaces -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $cfg (deepCopy $v.config)) -}}
{{- end -}}

{{/* The engines' connector configurations (JSON), for vLLM's
     --kv-transfer-config and SGLang's --hicache-storage-backend-extra-config. */}}
{{- define "kvtier.engineTarget" -}}
{{ printf "unix://%s" (include "kvtier.socket" .) }}
{{- end -}}
