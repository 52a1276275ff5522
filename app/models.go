package app

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/tokentap/tokentap/exporter"
)

// modelsRefresh is how often the engine's model list is read.
const modelsRefresh = time.Minute

// refreshModels reads the engine's model list (GET /v1/models, the
// OpenAI shape every engine here serves) at once and then every
// modelsRefresh until ctx is done, and gives it to the model-label bound:
// the names the engine serves always have their own label. A failure
// keeps the last list and is logged at debug level (an engine without
// the route is normal).
func refreshModels(ctx context.Context, up *url.URL, labels *exporter.ModelLabels, log *slog.Logger) {
	u := *up
	u.Path = joinPath(u.Path, "/v1/models")
	client := &http.Client{Timeout: 5 * time.Second}
	t := time.NewTicker(modelsRefresh)
	defer t.Stop()
	for {
		names, err := listModels(ctx, client, u.String())
		if err != nil {
			log.Debug("reading the engine's model list", "err", err)
		} else {
			labels.SetListed(names)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func listModels(ctx context.Context, client *http.Client, u string) ([]string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, &httpStatusError{resp.Status}
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		names = append(names, m.ID)
	}
	return names, nil
}

type httpStatusError struct{ status string }

func (e *httpStatusError) Error() string { return "engine answered " + e.status }
