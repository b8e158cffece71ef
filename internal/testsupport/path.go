package testsupport

import "strings"

type parsedPath struct {
	resource, subresource, namespace, name string
	// created is the name in the object a create (POST) sends, when a
	// rule matches by name; the path of a create names no object.
	created string
}

// parsePath splits an API path:
// /apis/storage.k8s.io/v1/volumeattachments/va/status → resource
// volumeattachments, name va, subresource status;
// /api/v1/namespaces/ns/pods/p → pods in ns, name p;
// /api/v1/namespaces/ns → namespaces, name ns.
func parsePath(path string) parsedPath {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	i := 2 // api/v1/<resource>
	if len(parts) > 0 && parts[0] == "apis" {
		i = 3 // apis/<group>/<version>/<resource>
	}
	var p parsedPath
	if i < len(parts) && parts[i] == "namespaces" && i+2 < len(parts) {
		p.namespace = parts[i+1]
		i += 2
	}
	if i >= len(parts) {
		return parsedPath{resource: path}
	}
	p.resource = parts[i]
	if i+1 < len(parts) {
		p.name = parts[i+1]
	}
	if i+2 < len(parts) {
		p.subresource = parts[i+2]
	}
	return p
}

// ResourceOf turns an API path into "resource[/subresource]":
// /api/v1/namespaces/ns/pods/p/status → "pods/status".
func ResourceOf(path string) string {
	p := parsePath(path)
	if p.subresource != "" {
		return p.resource + "/" + p.subresource
	}
	return p.resource
}
