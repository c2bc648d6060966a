package translate

import (
	"fmt"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	lua "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/servemesh/servemesh/wire"
)

// usageReaderFilter reads the tokens of each answer of an endpoint with a
// token quota into dynamic metadata (wire.UsageMetadata), which the global
// rate limit filter charges when the answer ends (tokenQuotaLimits). Off
// but on those endpoints' routes.
const usageReaderFilter = "servemesh.usage_reader"

// usageScript names usageSource among the filter's scripts.
const usageScript = "usage"

// usageSource reads an answer's body as it passes, chunk by chunk (Envoy
// neither buffers nor delays it: a stream stays a stream), for OpenAI's
// "total_tokens" (a JSON answer's usage, or a streamed answer's last
// chunk's), keeping the last it saw; the tail of each chunk is kept, so a
// figure split between two chunks is read too.
var usageSource = fmt.Sprintf(`function envoy_on_response(h)
  local tail, total = "", nil
  for chunk in h:bodyChunks() do
    local s = tail .. chunk:getBytes(0, chunk:length())
    for n in string.gmatch(s, '"total_tokens"%%s*:%%s*(%%d+)') do total = n end
    tail = string.sub(s, -64)
  end
  if total then h:streamInfo():dynamicMetadata():set(%q, %q, total) end
end`, wire.UsageMetadata, wire.UsageTokensKey)

// usageReader is the filter on a listener: its own script is empty, so
// it reads nothing but on a route that names usageScript.
func usageReader(in filterInput) (*hcm.HttpFilter, error) {
	config, err := anypb.New(&lua.Lua{
		DefaultSourceCode: &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: ""}},
		SourceCodes:       map[string]*core.DataSource{usageScript: {Specifier: &core.DataSource_InlineString{InlineString: usageSource}}},
	})
	if err != nil {
		return nil, fmt.Errorf("pack usage reader filter: %w", err)
	}
	return &hcm.HttpFilter{Name: usageReaderFilter, Disabled: in.offUntilRouted(), ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: config}}, nil
}

// usageReaderOn turns the usage reader on for a route.
func usageReaderOn() *anypb.Any {
	return mustAny(&route.FilterConfig{Config: mustAny(&lua.LuaPerRoute{Override: &lua.LuaPerRoute_Name{Name: usageScript}})})
}
