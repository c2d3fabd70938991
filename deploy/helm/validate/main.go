// weir-k8s-validate reads rendered manifests (`helm template` output) on stdin and
// decodes each object strictly into its Kubernetes API type: an unknown or misspelled
// field, a value of the wrong type or an unexpected kind/apiVersion is an error. helm
// lint does not check fields against the API, and a schema checker such as kubeconform
// fetches its schemas over the network at run time; the API types come from the Go
// modules that helm is built from. Used by crates/weir-config/tests/helm_chart.rs.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// The kinds the chart makes, at the API versions it uses.
func typed(apiVersion, kind string) (any, bool) {
	switch apiVersion + " " + kind {
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, true
	case "v1 Secret":
		return &corev1.Secret{}, true
	case "v1 Service":
		return &corev1.Service{}, true
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, true
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, true
	}
	return nil, false
}

func main() {
	reader := k8syaml.NewYAMLReader(bufio.NewReader(os.Stdin))
	n, failed := 0, false
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "reading YAML: %v\n", err)
			os.Exit(2)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			fmt.Fprintf(os.Stderr, "document %d: %v\n", n, err)
			failed = true
			continue
		}
		if head.Kind == "" && head.APIVersion == "" {
			continue // only comments
		}
		n++
		name := fmt.Sprintf("%s %s/%s", head.APIVersion, head.Kind, head.Metadata.Name)
		obj, ok := typed(head.APIVersion, head.Kind)
		if !ok {
			fmt.Fprintf(os.Stderr, "%s: kind or apiVersion not known to this check\n", name)
			failed = true
			continue
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
	if n == 0 {
		fmt.Fprintln(os.Stderr, "no objects on stdin")
		os.Exit(1)
	}
	fmt.Printf("%d objects valid\n", n)
}
