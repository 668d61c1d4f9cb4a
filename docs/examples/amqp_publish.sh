#!/bin/sh
# Enqueueing from a shell with amqp-publish (Debian's amqp-tools). It sets neither the type nor
# the message_id property: the type goes in the JSON body, where a Router finds it, and the job
# has no message_id. It does not wait for a confirm either: fine for a script, not for an app.
# Usage: amqp_publish.sh JSON-PAYLOAD
url="${RICOCHET_AMQP_URL:-amqp://guest:guest@localhost:5672/}"
# amqp-tools reads a URL ending in "/" as the vhost "" (the default vhost is "/": no path, or %2F).
amqp-publish --url="${url%/}" --routing-key="${RICOCHET_QUEUE:-jobs}" --persistent \
  --content-type=application/json --header="max-retries: 1" --body="$1"
