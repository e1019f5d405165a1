-- Tracing (R9.6): the W3C trace context (`traceparent`) of the span that started the
-- instance, so every run of it — on whichever node, after whichever crash — and its sub-flow
-- children continue the same trace. Expand only: one nullable column.
ALTER TABLE flow_instance ADD COLUMN trace_context TEXT;
