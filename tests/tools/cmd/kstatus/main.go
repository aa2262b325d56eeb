// Command kstatus reads Kubernetes objects as JSON, one per line on standard input, and
// prints for each the status that sigs.k8s.io/cli-utils' kstatus computes for it (the rules
// Flux health checks and kpt use): one line "<status>\t<message>".
package main

import (
	"bufio"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		// The API machinery's decoder: integers stay int64, as in objects read from a cluster.
		var obj map[string]interface{}
		if err := json.Unmarshal(in.Bytes(), &obj); err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: not a JSON object: %v\n", err)
			os.Exit(2)
		}
		res, err := status.Compute(&unstructured.Unstructured{Object: obj})
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: %v\n", err)
			os.Exit(2)
		}
		fmt.Printf("%s\t%s\n", res.Status, res.Message)
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: %v\n", err)
		os.Exit(2)
	}
}
