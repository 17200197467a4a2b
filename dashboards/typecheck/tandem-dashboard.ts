// The type every Tandem dashboard is checked against: @grafana/schema's
// Dashboard, with the Prometheus queries spelled out (the schema types panel
// targets as bare records and annotation targets as a DataQuery without
// `expr`, so a misspelled query field would go unnoticed). asGrafana() and
// asDataQuery() prove that what passes here is a Grafana Dashboard.
//
// tests/e2e/test_dashboards_typecheck.py writes each dashboards/grafana/*.json
// as an object literal of this type and runs tsc (strict), so a wrong field
// type, an unknown field or a misspelled enum value fails the check.
import type { AnnotationQuery, Dashboard, DataQuery, Panel, RowPanel } from '@grafana/schema';

export type PrometheusQuery = {
  refId: string;
  datasource?: { type?: string; uid?: string };
  hide?: boolean;
  queryType?: string;
  expr: string;
  legendFormat?: string;
  instant?: boolean;
  range?: boolean;
  interval?: string;
  format?: 'time_series' | 'table' | 'heatmap';
};
export type PrometheusPanel = Omit<Panel, 'targets'> & { targets?: PrometheusQuery[] };
export type PrometheusRowPanel = Omit<RowPanel, 'panels'> & { panels: PrometheusPanel[] };
export type TandemDashboard = Omit<Dashboard, 'panels' | 'annotations'> & {
  panels?: Array<PrometheusPanel | PrometheusRowPanel>;
  annotations?: { list?: Array<AnnotationQuery<PrometheusQuery>> };
};
export function asGrafana(d: TandemDashboard): Dashboard {
  return d;
}
// A Prometheus query is a Grafana DataQuery.
export function asDataQuery(q: PrometheusQuery): DataQuery {
  return q;
}
