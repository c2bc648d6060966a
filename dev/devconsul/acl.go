package devconsul

import (
	"context"
	"fmt"

	"github.com/hashicorp/consul/api"
)

// TokenRequest is one daemon's Consul token, as deploy/consul/README.md
// makes it: a policy (created once by name, rules as given) and the node
// and service identities the token alone holds.
type TokenRequest struct {
	Description string
	// Policy names the policy; Rules are its rules, used when no policy
	// of that name exists yet.
	Policy, Rules string
	// ConsulNode, if set, is the node identity (in dc1): the token
	// registers services on that Consul node only.
	ConsulNode string
	// Service, if set, is the service identity the token may register and
	// get a Connect certificate for.
	Service string
}

// MintToken creates r's token with admin, a management client, and
// returns its secret.
func MintToken(ctx context.Context, admin *api.Client, r TokenRequest) (string, error) {
	q := (&api.QueryOptions{}).WithContext(ctx)
	w := (&api.WriteOptions{}).WithContext(ctx)
	policies, _, err := admin.ACL().PolicyList(q)
	if err != nil {
		return "", fmt.Errorf("consul ACL policies: %w", err)
	}
	var policyID string
	for _, p := range policies {
		if p.Name == r.Policy {
			policyID = p.ID
		}
	}
	if policyID == "" {
		p, _, err := admin.ACL().PolicyCreate(&api.ACLPolicy{Name: r.Policy, Rules: r.Rules}, w)
		if err != nil {
			return "", fmt.Errorf("consul ACL policy %s: %w", r.Policy, err)
		}
		policyID = p.ID
	}
	token := &api.ACLToken{Description: r.Description, Policies: []*api.ACLTokenPolicyLink{{ID: policyID}}}
	if r.ConsulNode != "" {
		token.NodeIdentities = []*api.ACLNodeIdentity{{NodeName: r.ConsulNode, Datacenter: "dc1"}}
	}
	if r.Service != "" {
		token.ServiceIdentities = []*api.ACLServiceIdentity{{ServiceName: r.Service}}
	}
	created, _, err := admin.ACL().TokenCreate(token, w)
	if err != nil {
		return "", fmt.Errorf("consul ACL token %q: %w", r.Description, err)
	}
	return created.SecretID, nil
}
