{{/* The webhook's matchConditions under automatic migration, for a list of native GPU resource names:
     the same CEL as k8s/components/auto-migration (tests/unit/deploy checks they agree). */}}
{{- define "tfpool.autoMigrationConditions" -}}
{{- $names := printf "[%s]" (include "tfpool.celStrings" .) -}}
- name: not-opted-out
  expression: >-
    !has(object.metadata.labels) || !('tensor-fusion.ai/enabled' in object.metadata.labels)
    || object.metadata.labels['tensor-fusion.ai/enabled'] != 'false'
- name: opted-in-or-native-gpu
  expression: >-
    (has(object.metadata.labels) && 'tensor-fusion.ai/enabled' in object.metadata.labels
    && object.metadata.labels['tensor-fusion.ai/enabled'] == 'true')
    || object.spec.containers.exists(c, has(c.resources)
    && ((has(c.resources.limits) && {{ $names }}.exists(r, r in c.resources.limits))
    || (has(c.resources.requests) && {{ $names }}.exists(r, r in c.resources.requests))))
{{- end -}}

{{- define "tfpool.celStrings" -}}
{{- $quoted := list -}}
{{- range . }}{{ $quoted = append $quoted (printf "'%s'" .) }}{{ end -}}
{{- join ", " $quoted -}}
{{- end -}}
