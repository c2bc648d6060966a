// Package rayserve reads a Ray Serve 2.x config file (what `serve deploy`
// takes: applications of deployments) into servemesh's spec, so a Ray
// Serve user's file is applied as it is (`servemesh apply -f`, or
// `servemesh import ray -f` to see and keep the servemesh file). It owns no
// state. In the flow of docs/architecture.md: step 1 (before the config
// file reaches the API), as controlplane/gatewayapi is for HTTPRoutes.
//
// Each deployment is a backend, named application-deployment, whose
// replicas run servemesh's Python replica runtime with the class its
// application's import_path module defines under the deployment's name
// (module:Deployment): num_replicas ("auto" too), autoscaling_config,
// user_config, max_ongoing_requests (max_concurrent_queries) and
// ray_actor_options' num_cpus (1 by default, as Ray's), num_gpus (the
// nodes' "gpu" resource), memory and resources carry over, and the
// runtime_env's env_vars. Each application is an endpoint, named by the
// application, at its route_prefix (none: headless), sending all its
// requests to its ingress deployment: the one import_path names, else the
// last listed, as `serve build` writes them; every other deployment gets
// a headless endpoint of its backend's name, which a replica calls with
// servemesh.get_handle. http_options.request_timeout_s is every
// endpoint's timeout.
//
// What has no equivalent (proxy_location, a pip runtime_env, health check
// periods, application args, ...) is reported as a note, never dropped
// silently; what cannot be read is an error naming the field.
package rayserve
