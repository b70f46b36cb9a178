// Command etcd is the etcd server of the pinned release (go.etcd.io/etcd/server/v3), unchanged:
// etcd's own main is in a module of its own, so this one-line main builds it from tools/kubernetes/go.mod.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
