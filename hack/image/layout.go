package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// mediaTypeSPDX is the SBOM's media type, as artifact type and layer type.
const mediaTypeSPDX = "application/spdx+json"

// layoutResult is what writeLayout wrote.
type layoutResult struct {
	index    digest.Digest // the multi-platform image index
	images   []writtenImage
	revision string
	modified bool
}

type writtenImage struct {
	platform     platform
	manifest     digest.Digest
	compressed   int64 // manifest, config and layer as stored and pushed
	uncompressed int64 // the layer unpacked
	modules      int
}

// layout collects the blobs of an OCI image layout.
type layout struct {
	dir string
}

// blob writes content under blobs/sha256 and returns its descriptor.
func (l layout) blob(mediaType string, content []byte) (ocispec.Descriptor, error) {
	sum := sha256.Sum256(content)
	hexSum := hex.EncodeToString(sum[:])
	if err := os.WriteFile(filepath.Join(l.dir, "blobs", "sha256", hexSum), content, 0o644); err != nil {
		return ocispec.Descriptor{}, err
	}
	return ocispec.Descriptor{MediaType: mediaType, Digest: digest.NewDigestFromEncoded(digest.SHA256, hexSum), Size: int64(len(content))}, nil
}

func (l layout) json(mediaType string, v any) (ocispec.Descriptor, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return l.blob(mediaType, raw)
}

// writeLayout replaces dir with an OCI image layout
// (https://github.com/opencontainers/image-spec/blob/v1.1.1/image-layout.md)
// whose index.json names one image index, tagged tag, holding one image per
// platform and, for each image, its SBOM as an artifact manifest whose
// subject is that image (platform unknown/unknown, so that no runtime picks
// it; a registry with the OCI 1.1 referrers API lists it as the image's
// referrer).
func writeLayout(dir, tag string, images []platformImage) (layoutResult, error) {
	if err := os.RemoveAll(dir); err != nil {
		return layoutResult{}, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o755); err != nil {
		return layoutResult{}, err
	}
	l := layout{dir: dir}
	res := layoutResult{revision: images[0].revision, modified: images[0].modified}
	annotations := images[0].labels // the same on every platform: title, version, source, revision, created
	var imageDescs, sbomDescs []ocispec.Descriptor
	for _, img := range images {
		layerDesc, err := l.blob(ocispec.MediaTypeImageLayerGzip, img.layer)
		if err != nil {
			return layoutResult{}, err
		}
		created := img.created
		config := ocispec.Image{
			Created:  &created,
			Platform: ocispec.Platform{OS: img.platform.os, Architecture: img.platform.arch},
			Config: ocispec.ImageConfig{
				User:       fmt.Sprintf("%d:%d", nonroot, nonroot),
				Entrypoint: []string{"/" + img.binary},
				WorkingDir: "/",
				Labels:     img.labels,
			},
			RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.Digest(img.diffID)}},
			History: []ocispec.History{{
				Created:   &created,
				CreatedBy: "go run ./hack/image " + img.binary + ": users root, nobody and nonroot (65532), /home/nonroot, /tmp, /" + img.binary,
				Comment:   "built from Go modules alone, no base image",
			}},
		}
		configDesc, err := l.json(ocispec.MediaTypeImageConfig, config)
		if err != nil {
			return layoutResult{}, err
		}
		manifestDesc, err := l.json(ocispec.MediaTypeImageManifest, ocispec.Manifest{
			Versioned:   specs.Versioned{SchemaVersion: 2},
			MediaType:   ocispec.MediaTypeImageManifest,
			Config:      configDesc,
			Layers:      []ocispec.Descriptor{layerDesc},
			Annotations: annotations,
		})
		if err != nil {
			return layoutResult{}, err
		}
		manifestDesc.Platform = &ocispec.Platform{OS: img.platform.os, Architecture: img.platform.arch}
		imageDescs = append(imageDescs, manifestDesc)

		sbomDesc, err := l.sbom(img, manifestDesc)
		if err != nil {
			return layoutResult{}, err
		}
		sbomDescs = append(sbomDescs, sbomDesc)
		res.images = append(res.images, writtenImage{
			platform:     img.platform,
			manifest:     manifestDesc.Digest,
			compressed:   manifestDesc.Size + configDesc.Size + layerDesc.Size,
			uncompressed: img.uncompressed,
			modules:      img.modules,
		})
	}
	indexDesc, err := l.json(ocispec.MediaTypeImageIndex, ocispec.Index{
		Versioned:   specs.Versioned{SchemaVersion: 2},
		MediaType:   ocispec.MediaTypeImageIndex,
		Manifests:   append(imageDescs, sbomDescs...),
		Annotations: annotations,
	})
	if err != nil {
		return layoutResult{}, err
	}
	res.index = indexDesc.Digest
	indexDesc.Annotations = map[string]string{ocispec.AnnotationRefName: tag}
	top, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{indexDesc},
	})
	if err != nil {
		return layoutResult{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, ocispec.ImageIndexFile), top, 0o644); err != nil {
		return layoutResult{}, err
	}
	marker, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return layoutResult{}, err
	}
	return res, os.WriteFile(filepath.Join(dir, ocispec.ImageLayoutFile), marker, 0o644)
}

// sbom writes img's SBOM as an OCI 1.1 artifact: an image manifest of
// artifactType application/spdx+json, the empty config, the document as its
// one layer and subject the image.
func (l layout) sbom(img platformImage, subject ocispec.Descriptor) (ocispec.Descriptor, error) {
	emptyDesc, err := l.blob(ocispec.MediaTypeEmptyJSON, ocispec.DescriptorEmptyJSON.Data)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	emptyDesc.Data = ocispec.DescriptorEmptyJSON.Data
	docDesc, err := l.blob(mediaTypeSPDX, img.sbom)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	docDesc.Annotations = map[string]string{ocispec.AnnotationTitle: sbomFileName(img.binary, img.platform)}
	subject.Platform = nil
	desc, err := l.json(ocispec.MediaTypeImageManifest, ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: mediaTypeSPDX,
		Config:       emptyDesc,
		Layers:       []ocispec.Descriptor{docDesc},
		Subject:      &subject,
		Annotations:  map[string]string{ocispec.AnnotationCreated: img.created.Format(time.RFC3339)},
	})
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	// The index entry names no artifactType (the manifest does): skopeo
	// 1.9 drops that field when it copies an index, which changes the
	// index's digest.
	desc.Platform = &ocispec.Platform{OS: "unknown", Architecture: "unknown"}
	return desc, nil
}
