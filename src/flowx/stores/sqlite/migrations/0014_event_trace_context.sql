-- Tracing (R9.6): the W3C trace context (`traceparent`) a staged event was emitted in, sent
-- as a header with it, so its consumer continues the instance's trace. Expand only: one
-- nullable column.
ALTER TABLE outbox_event ADD COLUMN trace_context TEXT;
