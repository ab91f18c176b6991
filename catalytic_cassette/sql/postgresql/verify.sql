-- What `verify` reads from a PostgreSQL ledger (catalytic_cassette/postgresql/verify.py),
-- by name. Plain SELECTs on the tables and on pg_catalog only: no ledger function, no
-- view, no index (the transaction turns index scans off), every name qualified. The
-- catalog queries describe the ledger's objects in schema public as the migrations make
-- them (catalog.py compares the description with catalog-<major>.json); a role is named
-- '<owner>' when it owns the object, 'PUBLIC' for everyone. The roles the migrations
-- make are named here (a migration adding one adds it to both lists).

-- name: verify_settings
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
       pg_catalog.set_config('row_security', 'off', true),
       pg_catalog.set_config('enable_indexscan', 'off', true),
       pg_catalog.set_config('enable_indexonlyscan', 'off', true),
       pg_catalog.set_config('enable_bitmapscan', 'off', true),
       pg_catalog.set_config('work_mem', '64MB', true);

-- name: verify_has_ledger
SELECT c.relname FROM pg_catalog.pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
   AND c.relname IN ('cassette_migrations', 'cassette_journal', 'cassette_head');

-- name: verify_migrations
SELECT version, name FROM ONLY public.cassette_migrations ORDER BY version;

-- name: verify_meta_keys
SELECT key FROM ONLY public.cassette_meta ORDER BY key COLLATE "C";

-- name: verify_meta
SELECT key, value FROM ONLY public.cassette_meta ORDER BY key COLLATE "C";

-- name: verify_head
SELECT time_ms FROM ONLY public.cassette_head;

-- name: verify_journal
SELECT seq, body, leaf_hash, chain_hash, tbl, row_key FROM ONLY public.cassette_journal ORDER BY seq;

-- name: catalog_relations
SELECT c.relname, c.relkind::text, c.relpersistence::text, c.relrowsecurity,
       c.relforcerowsecurity, c.relispartition
  FROM pg_catalog.pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind <> 'i';

-- name: catalog_columns
SELECT c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_catalog.pg_get_expr(d.adbin, d.adrelid), a.attidentity::text, a.attgenerated::text,
       coll.collname
  FROM pg_catalog.pg_attribute a
  JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  LEFT JOIN pg_catalog.pg_collation coll ON coll.oid = a.attcollation
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind <> 'i'
   AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY c.relname, a.attnum;

-- name: catalog_constraints
SELECT c.relname, k.conname, k.contype::text, pg_catalog.pg_get_constraintdef(k.oid),
       k.condeferrable, k.condeferred, k.convalidated
  FROM pg_catalog.pg_constraint k
  JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
 WHERE c.relnamespace = 'public'::regnamespace;

-- name: catalog_indexes
SELECT t.relname, i.relname, pg_catalog.pg_get_indexdef(x.indexrelid), x.indisvalid,
       x.indisready, x.indislive
  FROM pg_catalog.pg_index x
  JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
  JOIN pg_catalog.pg_class t ON t.oid = x.indrelid
 WHERE i.relnamespace = 'public'::regnamespace OR t.relnamespace = 'public'::regnamespace;

-- name: catalog_triggers
SELECT c.relname, t.tgname, pg_catalog.pg_get_triggerdef(t.oid), t.tgenabled::text
  FROM pg_catalog.pg_trigger t
  JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal;

-- name: catalog_functions
SELECT p.oid::pg_catalog.regprocedure::text, l.lanname, p.prokind::text, p.prosrc, p.probin,
       p.prosecdef, p.proconfig, p.provolatile::text, p.proisstrict, p.proleakproof,
       p.proparallel::text, pg_catalog.pg_get_function_result(p.oid)
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = 'public'::regnamespace;

-- name: catalog_relation_grants
SELECT c.relname, CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                       WHEN a.grantee = c.relowner THEN '<owner>'
                       ELSE pg_catalog.pg_get_userbyid(a.grantee) END,
       a.privilege_type, a.is_grantable
  FROM pg_catalog.pg_class c,
       pg_catalog.aclexplode(coalesce(c.relacl, pg_catalog.acldefault(
           CASE WHEN c.relkind = 'S' THEN 's'::"char" ELSE 'r'::"char" END, c.relowner))) a
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind <> 'i';

-- name: catalog_column_grants
SELECT c.relname, t.attname, CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                  WHEN a.grantee = c.relowner THEN '<owner>'
                                  ELSE pg_catalog.pg_get_userbyid(a.grantee) END,
       a.privilege_type, a.is_grantable
  FROM pg_catalog.pg_attribute t
  JOIN pg_catalog.pg_class c ON c.oid = t.attrelid,
       pg_catalog.aclexplode(t.attacl) a
 WHERE c.relnamespace = 'public'::regnamespace AND t.attacl IS NOT NULL;

-- name: catalog_function_grants
SELECT p.oid::pg_catalog.regprocedure::text, CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                       WHEN a.grantee = p.proowner THEN '<owner>'
                       ELSE pg_catalog.pg_get_userbyid(a.grantee) END,
       a.privilege_type, a.is_grantable
  FROM pg_catalog.pg_proc p,
       pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f'::"char", p.proowner))) a
 WHERE p.pronamespace = 'public'::regnamespace;

-- Who may use or create in the ledger's schema (a role that may create there can plant
-- a function the owner's code resolves: schema/70_roles.sql revokes CREATE from PUBLIC).
-- name: catalog_schema_grants
SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
            WHEN a.grantee = n.nspowner THEN '<owner>'
            ELSE pg_catalog.pg_get_userbyid(a.grantee) END,
       a.privilege_type, a.is_grantable
  FROM pg_catalog.pg_namespace n,
       pg_catalog.aclexplode(coalesce(n.nspacl, pg_catalog.acldefault('n'::"char", n.nspowner))) a
 WHERE n.oid = 'public'::regnamespace;

-- name: catalog_rules
SELECT c.relname, r.rulename, pg_catalog.pg_get_ruledef(r.oid), r.ev_enabled::text
  FROM pg_catalog.pg_rewrite r
  JOIN pg_catalog.pg_class c ON c.oid = r.ev_class
 WHERE c.relnamespace = 'public'::regnamespace;

-- name: catalog_policies
SELECT c.relname, p.polname, p.polcmd::text, p.polpermissive,
       pg_catalog.pg_get_expr(p.polqual, p.polrelid),
       pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid)
  FROM pg_catalog.pg_policy p
  JOIN pg_catalog.pg_class c ON c.oid = p.polrelid
 WHERE c.relnamespace = 'public'::regnamespace;

-- name: catalog_inheritance
SELECT p.oid::pg_catalog.regclass::text, c.oid::pg_catalog.regclass::text
  FROM pg_catalog.pg_inherits i
  JOIN pg_catalog.pg_class p ON p.oid = i.inhparent
  JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
 WHERE p.relnamespace = 'public'::regnamespace OR c.relnamespace = 'public'::regnamespace;

-- name: catalog_types
SELECT t.typname, t.typtype::text
  FROM pg_catalog.pg_type t
 WHERE t.typnamespace = 'public'::regnamespace AND t.typrelid = 0 AND t.typcategory <> 'A';

-- name: catalog_operators
SELECT o.oid::pg_catalog.regoperator::text
  FROM pg_catalog.pg_operator o WHERE o.oprnamespace = 'public'::regnamespace;

-- name: catalog_event_triggers
SELECT e.evtname, e.evtevent, e.evtenabled::text, e.evtfoid::pg_catalog.regprocedure::text
  FROM pg_catalog.pg_event_trigger e;

-- Settings attached to this database (for any role), to a ledger role, or to every role
-- in every database (ALTER ROLE ALL SET: session_replication_role there would reach
-- every session of the cluster).
-- name: catalog_settings
SELECT coalesce(r.rolname, ''), s.setdatabase = 0, s.setconfig
  FROM pg_catalog.pg_db_role_setting s
  LEFT JOIN pg_catalog.pg_roles r ON r.oid = s.setrole
 WHERE s.setdatabase = (SELECT d.oid FROM pg_catalog.pg_database d
                         WHERE d.datname = pg_catalog.current_database())
    OR (s.setdatabase = 0 AND s.setrole = 0)
    OR (s.setdatabase = 0
        AND r.rolname IN ('cassette_worker', 'cassette_appender', 'cassette_auditor'));

-- name: catalog_roles
SELECT r.rolname, r.rolsuper, r.rolbypassrls, r.rolcreaterole, r.rolreplication
  FROM pg_catalog.pg_roles r
 WHERE r.rolname IN ('cassette_worker', 'cassette_appender', 'cassette_auditor');

-- Who owns what (postgresql/ownership.py): the database, schema public and every object
-- in it, with whether the owner is a superuser and the object a SECURITY DEFINER
-- function. The ledger's owner is the role that owns cassette_migrations, the first
-- object the migrations make.
-- name: verify_owners
SELECT o.kind, o.name, o.rel, pg_catalog.pg_get_userbyid(o.owner), r.rolsuper, o.definer,
       o.owner = (SELECT c.relowner FROM pg_catalog.pg_class c
                   WHERE c.relnamespace = 'public'::regnamespace
                     AND c.relname = 'cassette_migrations')
  FROM (SELECT 'database' AS kind, d.datname::text AS name, NULL::text AS rel,
               d.datdba AS owner, false AS definer
          FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()
        UNION ALL
        SELECT 'schema', n.nspname::text, NULL, n.nspowner, false
          FROM pg_catalog.pg_namespace n WHERE n.oid = 'public'::regnamespace
        UNION ALL
        SELECT CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index'
                              WHEN 'I' THEN 'index' WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view'
                              WHEN 'm' THEN 'materialized view' WHEN 'f' THEN 'foreign table'
                              ELSE 'relation' END,
               c.relname::text, c.relname::text, c.relowner, false
          FROM pg_catalog.pg_class c WHERE c.relnamespace = 'public'::regnamespace
        UNION ALL
        SELECT 'function', p.oid::pg_catalog.regprocedure::text, NULL, p.proowner, p.prosecdef
          FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'public'::regnamespace
        UNION ALL
        SELECT 'type', t.typname::text, NULL, t.typowner, false
          FROM pg_catalog.pg_type t WHERE t.typnamespace = 'public'::regnamespace
        UNION ALL
        SELECT 'operator', p.oid::pg_catalog.regoperator::text, NULL, p.oprowner, false
          FROM pg_catalog.pg_operator p WHERE p.oprnamespace = 'public'::regnamespace) o
  LEFT JOIN pg_catalog.pg_roles r ON r.oid = o.owner
 ORDER BY 1, 2;

-- name: verify_ledger_owner
SELECT pg_catalog.pg_get_userbyid(c.relowner), r.rolsuper
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_roles r ON r.oid = c.relowner
 WHERE c.relnamespace = 'public'::regnamespace AND c.relname = 'cassette_migrations';

-- Every membership into or out of the ledger's roles, and into the ledger's owner by a
-- member of one of them (postgresql/ownership.py judges them). inherit_option and
-- set_option exist from PostgreSQL 16 (read through to_jsonb: NULL before).
-- name: verify_memberships
SELECT pg_catalog.pg_get_userbyid(m.roleid), pg_catalog.pg_get_userbyid(m.member),
       m.admin_option, pg_catalog.to_jsonb(m) ->> 'inherit_option',
       pg_catalog.to_jsonb(m) ->> 'set_option', m.roleid = owner.oid, m.member = owner.oid
  FROM pg_catalog.pg_auth_members m,
       (SELECT c.relowner AS oid FROM pg_catalog.pg_class c
         WHERE c.relnamespace = 'public'::regnamespace
           AND c.relname = 'cassette_migrations') owner
 WHERE m.roleid IN (SELECT r.oid FROM pg_catalog.pg_roles r
                     WHERE r.rolname IN ('cassette_worker', 'cassette_appender', 'cassette_auditor'))
    OR m.member IN (SELECT r.oid FROM pg_catalog.pg_roles r
                     WHERE r.rolname IN ('cassette_worker', 'cassette_appender', 'cassette_auditor'))
    OR (m.roleid = owner.oid AND m.member IN (
          SELECT w.member FROM pg_catalog.pg_auth_members w
            JOIN pg_catalog.pg_roles r ON r.oid = w.roleid
           WHERE r.rolname IN ('cassette_worker', 'cassette_appender', 'cassette_auditor')))
 ORDER BY 1, 2;

-- Who was granted SET on session_replication_role (PostgreSQL 15's GRANT SET ON
-- PARAMETER): with it, a role that is no superuser switches every trigger off for its
-- session. A superuser has it without a grant.
-- name: catalog_parameter_grants
SELECT a.parname, CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                       ELSE pg_catalog.pg_get_userbyid(g.grantee) END,
       g.privilege_type, g.is_grantable
  FROM pg_catalog.pg_parameter_acl a, pg_catalog.aclexplode(a.paracl) g
 WHERE a.parname = 'session_replication_role';

-- One ledger table's rows, formatted by verify.py with the table's columns in journal-body
-- order (verify/tables.py).
-- name: verify_table_rows
SELECT {columns} FROM ONLY public.{table};
