"""The API gate (suite kind ``api``, ``make api``): what a user meets of an engine through the
OpenAI API, judged against the pinned vLLM's own server.

* :mod:`.kind`      the :class:`~harness.kinds.base.GateKind`: the oracle's plain generations, every
                    facet's probes planned from them, sent to both servers, judged, the controls
* :mod:`.settings`  the suite's ``[api]`` table
* :mod:`.surface`   one gate's requests and judgement, engine-free: plan, judge, run the controls
* :mod:`.views`     a reply (JSON body or stream) -> the :class:`~.views.View` facets compare
* :mod:`.observe`   send a facet's probes to an endpoint, keep every exchange
* :mod:`.reference` transformers' ``apply_chat_template`` renders and raw logprobs
* :mod:`.facets`    one module per facet (template, streaming, stop, detokenization, structured
                    output, tool calls, the logprob contract, robustness), each a registered
                    :class:`~.facets.base.Facet`; :mod:`.facets.base` holds a
                    :class:`~.facets.base.Probe` (one request as sent) and the
                    :class:`~.facets.base.Context` every facet plans from
* :mod:`.proxy`     the planted controls: a proxy in front of the real server with one fault each
"""
