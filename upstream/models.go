package upstream

import (
	"bytes"
	"encoding/json"
)

// refreshModels reads the engine's model list (GET /v1/models, the
// OpenAI shape every engine here serves) and tells SetModels. A failure
// keeps the last list and is logged at debug level (an engine without
// the route is normal).
func (u *Upstream) refreshModels(r *round) {
	names, err := u.models(r)
	if err != nil {
		u.log.Debug("reading the engine's model list", "err", err)
		return
	}
	if u.setModels != nil {
		u.setModels(names)
	}
}

func (u *Upstream) models(r *round) ([]string, error) {
	a := r.get("/v1/models", modelsTimeout, jsonBody)
	if a.err != nil {
		return nil, a.err
	}
	if a.status/100 != 2 {
		return nil, &statusError{a.line}
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(bytes.NewReader(a.body)).Decode(&list); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		names = append(names, m.ID)
	}
	return names, nil
}

type statusError struct{ status string }

func (e *statusError) Error() string { return "engine answered " + e.status }
