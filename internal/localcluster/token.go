package localcluster

import (
	"crypto/rand"
	"encoding/hex"
)

func randomToken() string {
	b := make([]byte, 24)
	// crypto/rand.Read never returns an error on supported platforms.
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
