// Package devllama is the real model server `make tools` installs:
// llama.cpp's OpenAI-compatible server (PyPI llama-cpp-python, built from
// source, in .tools/llama-venv) and the small model tools/model/make_model.py
// writes (.tools/models). It finds them and says how to run the server as
// a backend's replicas behind the mesh, the one place the demo
// (daemon), the e2e tests and bench/engine take that from, so
// the settings a mesh needs of the server (Args) hold everywhere. Off the
// flow of docs/architecture.md: a tool, like dev/devconsul.
package devllama

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/servemesh/servemesh/internal/toolpath"
	"github.com/servemesh/servemesh/meshspec"
)

// HealthPath is what the mesh probes a replica's server on: FastAPI's
// schema, which answers while a completion runs. The server's
// /v1/models waits for the model's lock, so a probe of it waits for the
// running completion (a long one reads as a dead replica), and with
// request interruption on (the server's default) it cuts that
// completion's stream short.
const HealthPath = "/openapi.json"

// Engine is the server and its model.
type Engine struct {
	// Python is the venv's interpreter; Interpreter the file it links
	// to, which an agent must allow too (AllowFlags).
	Python, Interpreter string
	// Model is the small GGUF model; its tokenizer's files are beside it
	// (Tokenizer).
	Model string
}

// Find finds the engine under the project's .tools.
func Find() (*Engine, error) {
	python, err := toolpath.Under(filepath.Join("llama-venv", "bin", "python"))
	if err != nil {
		return nil, fmt.Errorf("llama.cpp's server: %w", err)
	}
	model, err := toolpath.Under(filepath.Join("models", "tiny.gguf"))
	if err != nil {
		return nil, fmt.Errorf("llama.cpp's model: %w", err)
	}
	interpreter, err := filepath.EvalSymlinks(python)
	if err != nil {
		return nil, fmt.Errorf("llama.cpp's server: %w", err)
	}
	return &Engine{Python: python, Interpreter: interpreter, Model: model}, nil
}

// Check runs the engine's Python far enough to import its server.
func (e *Engine) Check(ctx context.Context) error {
	if out, err := exec.CommandContext(ctx, e.Python, "-c", "import llama_cpp.server").CombinedOutput(); err != nil {
		return fmt.Errorf("llama.cpp's server does not import (`make tools` installs it): %w\n%s", err, out)
	}
	return nil
}

// Tokenizer is the folder of the model's tokenizer files (tokenizer.json,
// tokenizer_config.json), which a benchmark tool loads.
func (e *Engine) Tokenizer() string { return filepath.Dir(e.Model) }

// AllowFlags are the agent flags that let it run the engine: the
// controller places a command by its path, an agent runs it once the
// file it leads to is allowed too (the venv's python is a link).
func (e *Engine) AllowFlags() []string {
	return []string{"--allow-command", e.Python, "--allow-command", e.Interpreter}
}

// Args run the server of the model as alias on host and port: one
// thread, for its prompts too (the server's batch threads default to
// every core: two engines on this 2-core machine then spun four threads
// on two cores in each other's way, and a 2,000-token prefill took 2.7 s
// where alone it takes 0.16 s), its RAM prompt cache on (it keeps several prompts' KV state,
// not the last one's alone), and its request interruption off, which
// would otherwise end the running completion's stream with [DONE] as soon
// as another request waits (another client's, or a probe), its answer cut
// and still a 200. extra are more of the server's flags.
func (e *Engine) Args(alias, host, port string, extra ...string) []string {
	args := []string{"-m", "llama_cpp.server", "--model", e.Model, "--model_alias", alias, "--host", host, "--port", port,
		"--n_ctx", "4096", "--n_threads", "1", "--n_threads_batch", "1", "--chat_format", "chatml", "--cache", "true", "--interrupt_requests", "false"}
	return append(args, extra...)
}

// Process runs the server as a backend's replicas (Args), on the host and
// port the agent gives each.
func (e *Engine) Process(alias string, extra ...string) *meshspec.ProcessSpec {
	return &meshspec.ProcessSpec{Command: e.Python, Args: e.Args(alias, "${HOST}", "${PORT}", extra...), HealthPath: HealthPath}
}

// MultiModel runs the server as replicas that serve the model under each
// of aliases, one loaded at a time (the server's own multi-model
// configuration, which loads a model as a request names it), from a
// configuration file it writes in dir.
func (e *Engine) MultiModel(dir string, aliases ...string) (*meshspec.ProcessSpec, error) {
	models := make([]map[string]any, 0, len(aliases))
	for _, alias := range aliases {
		models = append(models, map[string]any{"model": e.Model, "model_alias": alias, "n_ctx": 2048, "n_threads": 1, "n_threads_batch": 1, "chat_format": "chatml"})
	}
	text, err := json.Marshal(map[string]any{"models": models, "interrupt_requests": false})
	if err != nil {
		return nil, fmt.Errorf("llama.cpp's model configuration: %w", err)
	}
	config := filepath.Join(dir, "llama-models.json")
	if err := os.WriteFile(config, text, 0o644); err != nil {
		return nil, fmt.Errorf("llama.cpp's model configuration: %w", err)
	}
	// The server takes its host and port from $HOST and $PORT.
	return &meshspec.ProcessSpec{Command: e.Python, Args: []string{"-m", "llama_cpp.server", "--config_file", config}, HealthPath: HealthPath}, nil
}
