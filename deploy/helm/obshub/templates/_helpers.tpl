{{/* Names, labels and the shared pieces of every obshub workload. */}}

{{- define "obshub.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "obshub.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "obshub.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "obshub.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "obshub.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "obshub.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "obshub.scrapeAnnotations" -}}
{{- if .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* Environment of every component: the Kafka connection (secrets only by reference), logging. */}}
{{- define "obshub.env" -}}
{{- /* a value the components would refuse at start (a crash loop) fails the install instead, naming the key */ -}}
{{- if not (has .Values.kafka.securityProtocol (list "PLAINTEXT" "SSL" "SASL_PLAINTEXT" "SASL_SSL")) }}
{{- fail (printf "kafka.securityProtocol %q is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL" (toString .Values.kafka.securityProtocol)) }}
{{- end }}
{{- if and (hasPrefix "SASL" .Values.kafka.securityProtocol) (not (has .Values.kafka.sasl.mechanism (list "PLAIN" "SCRAM-SHA-256" "SCRAM-SHA-512"))) }}
{{- fail (printf "kafka.sasl.mechanism %q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512" (toString .Values.kafka.sasl.mechanism)) }}
{{- end }}
{{- if not (has .Values.logFormat (list "json" "text")) }}
{{- fail (printf "logFormat %q is not json or text" (toString .Values.logFormat)) }}
{{- end }}
- name: OBSHUB_BOOTSTRAP
  value: {{ .Values.kafka.bootstrap | quote }}
- name: OBSHUB_KAFKA_SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
- name: OBSHUB_KAFKA_REPLICATION_FACTOR
  value: {{ .Values.kafka.replicationFactor | quote }}
- name: OBSHUB_KAFKA_PARTITIONS
  value: {{ printf "obshub.events.v1=%d,obshub.steps.v1=%d,obshub.alerts.v1=%d,obshub.dlq.v1=%d" (int .Values.kafka.partitions.events) (int .Values.kafka.partitions.steps) (int .Values.kafka.partitions.alerts) (int .Values.kafka.partitions.dlq) | quote }}
{{- if hasPrefix "SASL" .Values.kafka.securityProtocol }}
- name: OBSHUB_KAFKA_SASL_MECHANISM
  value: {{ .Values.kafka.sasl.mechanism | quote }}
- name: OBSHUB_KAFKA_SASL_USERNAME
  value: {{ required "kafka.sasl.username is required with a SASL security protocol" .Values.kafka.sasl.username | quote }}
- name: OBSHUB_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ required "kafka.sasl.passwordSecret.name is required with a SASL security protocol" .Values.kafka.sasl.passwordSecret.name }}
      key: {{ .Values.kafka.sasl.passwordSecret.key }}
{{- end }}
{{- if .Values.kafka.tls.caSecret.name }}
- name: OBSHUB_KAFKA_SSL_CA_LOCATION
  value: /etc/obshub/kafka-ca/{{ .Values.kafka.tls.caSecret.key }}
{{- end }}
{{- if .Values.kafka.tls.clientCertSecret.name }}
- name: OBSHUB_KAFKA_SSL_CERTIFICATE_LOCATION
  value: /etc/obshub/kafka-client/tls.crt
- name: OBSHUB_KAFKA_SSL_KEY_LOCATION
  value: /etc/obshub/kafka-client/tls.key
{{- end }}
- name: OBSHUB_METRICS_ADDR
  value: {{ .Values.metrics.address | quote }}
- name: OBSHUB_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: OBSHUB_HOME
  value: /var/lib/obshub
- name: OBSHUB_CACHE
  value: /var/lib/obshub/cache
{{- end -}}

{{- define "obshub.kafkaVolumeMounts" -}}
{{- if .Values.kafka.tls.caSecret.name }}
- {name: kafka-ca, mountPath: /etc/obshub/kafka-ca, readOnly: true}
{{- end }}
{{- if .Values.kafka.tls.clientCertSecret.name }}
- {name: kafka-client, mountPath: /etc/obshub/kafka-client, readOnly: true}
{{- end }}
{{- end -}}

{{- define "obshub.kafkaVolumes" -}}
{{- if .Values.kafka.tls.caSecret.name }}
- name: kafka-ca
  secret: {secretName: {{ .Values.kafka.tls.caSecret.name }}, defaultMode: 0444}
{{- end }}
{{- if .Values.kafka.tls.clientCertSecret.name }}
- name: kafka-client
  secret: {secretName: {{ .Values.kafka.tls.clientCertSecret.name }}, defaultMode: 0400}
{{- end }}
{{- end -}}
