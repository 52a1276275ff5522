//go:build tools

// This file keeps github.com/gen2brain/malgo in go.mod: Ollama's llama.cpp
// (tools/mtmd) includes miniaudio.h, which Ollama's module zip omits and
// malgo's module ships. scripts/install-test-tools.sh passes malgo's module
// directory to the Ollama build through CGO_CPPFLAGS. Nothing here is built.
package tools

import _ "github.com/gen2brain/malgo"
