"""Per-node NATS credentials: an auth callout that lets each node agent act for its own node only.

The NATS server hands every connection that is not one of the services' own users to the callout
(`auth_callout` in `deploy/nats/callout.conf`). The callout checks the node's token (an HMAC of the
node's name under a secret only the callout and the operator hold, `node_access.node_token`) and
answers with a user JWT whose permissions name that node's own command consumer, its own durables
and its own inbox (`node_access.node_permissions`): a node cannot read another node's commands, which
may carry a worker's environment. `nkeys` and `jwt` are the NATS key and token formats, written from
their published specifications with the `cryptography` package's Ed25519.
"""
