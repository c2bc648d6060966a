"""A Ray Serve 2.x application written as its documentation's text_ml
example is, without Ray: Summarizer, the ingress, calls Translator through
a handle (as Ray's DeploymentHandle), each an async class taking
Starlette requests. serve_config.yaml is its `serve deploy` config, which
e2e TestPythonServed applies with `servemesh apply -f`."""

import servemesh


class Translator:
    def __init__(self):
        self.language = "french"

    def reconfigure(self, config):  # user_config, as Ray Serve's
        self.language = config.get("language", self.language)

    async def __call__(self, request):
        text = (await request.json())["text"]
        return {"translated": f"{text} ({self.language})"}


class Summarizer:
    def __init__(self):
        # Ray binds Summarizer.bind(Translator.bind()); servemesh's handle
        # names the endpoint the import gives the other deployment.
        self.translator = servemesh.get_handle("default-translator")

    async def __call__(self, request):
        summary = (await request.json())["text"][:5]
        translated = await self.translator.remote({"text": summary})
        return {"summary": summary, **translated}
