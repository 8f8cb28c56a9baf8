-- Quarantined records by reason category (the part of `reason` before the first colon).
select split_part(reason, ':', 1) as reason_category, count(*) as n_records,
       count(distinct source) as n_sources, min(source) as example_source, min(record) as example_record
from quarantine
group by all
order by n_records desc
