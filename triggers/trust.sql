-- What the reactor's schema holds, or allows, that its owner did not make: read from the catalog
-- alone, which every role may read, so `reactor migrate`, `run`, `sweep` and `status` all ask it.
--
-- The job trigger's functions are SECURITY DEFINER: they run as the role that ran `reactor
-- migrate`, and write to the reactor's tables. Anything another role made there (a trigger on
-- reactor.pending, a function, a table adopted by CREATE TABLE IF NOT EXISTS) would run with
-- that role's rights at the app's next job-finishing commit (CVE-2018-1058's lesson). So every
-- object in the schema must belong to the schema's owner, no other role may create in it, and
-- its tables carry no trigger, rule, policy or foreign key the reactor does not create (it
-- creates none of them there).

-- fragment: untrusted_problems
-- One row per problem, each a sentence that names the object, whose it is, and the fix.
WITH s AS (
    SELECT n.oid, n.nspowner, n.nspacl, n.nspname::text AS name,
           pg_get_userbyid(n.nspowner)::text AS owner
      FROM pg_namespace n
     WHERE n.nspname = @reactor_name@
), findings(kind, object, problem) AS (
    SELECT 'schema', s.name,
           'role ' || who || ' may create objects in it (REVOKE CREATE ON SCHEMA '
               || quote_ident(s.name) || ' FROM ' || who || ')'
      FROM s, aclexplode(s.nspacl) a,
           LATERAL (SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(a.grantee)) END) AS g(who)
     WHERE a.privilege_type = 'CREATE' AND a.grantee <> s.nspowner
    UNION ALL
    SELECT CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index'
                          WHEN 'I' THEN 'index' WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view'
                          WHEN 'm' THEN 'materialized view' WHEN 'f' THEN 'foreign table'
                          ELSE 'relation' END,
           c.oid::regclass::text,
           'owned by ' || quote_ident(pg_get_userbyid(c.relowner))
      FROM s JOIN pg_class c ON c.relnamespace = s.oid
     WHERE c.relowner <> s.nspowner
    UNION ALL
    SELECT CASE p.prokind WHEN 'p' THEN 'procedure' WHEN 'a' THEN 'aggregate'
                          ELSE 'function' END,
           p.oid::regprocedure::text,
           'owned by ' || quote_ident(pg_get_userbyid(p.proowner))
      FROM s JOIN pg_proc p ON p.pronamespace = s.oid
     WHERE p.proowner <> s.nspowner
    UNION ALL
    SELECT 'type', t.oid::regtype::text,
           'owned by ' || quote_ident(pg_get_userbyid(t.typowner))
      FROM s JOIN pg_type t ON t.typnamespace = s.oid
     WHERE t.typowner <> s.nspowner
       -- A table's row type and an array type follow their table's or element's owner.
       AND t.typrelid = 0 AND t.typelem = 0
    UNION ALL
    SELECT 'operator', o.oid::regoperator::text,
           'owned by ' || quote_ident(pg_get_userbyid(o.oprowner))
      FROM s JOIN pg_operator o ON o.oprnamespace = s.oid
     WHERE o.oprowner <> s.nspowner
    UNION ALL
    SELECT 'trigger', quote_ident(tg.tgname) || ' on ' || c.oid::regclass::text,
           'the reactor creates no trigger on its own tables'
      FROM s JOIN pg_class c ON c.relnamespace = s.oid
      JOIN pg_trigger tg ON tg.tgrelid = c.oid
     WHERE NOT tg.tgisinternal
    UNION ALL
    SELECT 'rule', quote_ident(r.rulename) || ' on ' || c.oid::regclass::text,
           'the reactor creates no rule on its own tables'
      FROM s JOIN pg_class c ON c.relnamespace = s.oid
      JOIN pg_rewrite r ON r.ev_class = c.oid
     WHERE c.relkind <> 'v' OR r.rulename <> '_RETURN'
    UNION ALL
    SELECT 'policy', quote_ident(pol.polname) || ' on ' || c.oid::regclass::text,
           'the reactor creates no row security policy'
      FROM s JOIN pg_class c ON c.relnamespace = s.oid
      JOIN pg_policy pol ON pol.polrelid = c.oid
    UNION ALL
    SELECT 'foreign key', quote_ident(k.conname) || ' of ' || k.conrelid::regclass::text,
           'references ' || k.confrelid::regclass::text || ' from outside the reactor''s schema'
      FROM s JOIN pg_class c ON c.relnamespace = s.oid
      JOIN pg_constraint k ON k.confrelid = c.oid AND k.contype = 'f'
      JOIN pg_class referencing ON referencing.oid = k.conrelid
     WHERE referencing.relnamespace <> s.oid
)
SELECT findings.kind || ' ' || findings.object || ' in the reactor''s schema ' || quote_ident(s.name)
       || ' (owner ' || quote_ident(s.owner) || '): ' || findings.problem AS problem
  FROM findings, s
 ORDER BY findings.kind, findings.object

-- name: untrusted
{{untrusted_problems}}

-- name: guard
-- The same check for the printed script, which a migration tool applies as it is: the
-- transaction it opens fails before it changes anything, as `reactor migrate` would refuse. The
-- schema, when it exists already, must also be the migrating role's own.
DO $reactor_trust$
DECLARE
    refusal text;
BEGIN
    SELECT 'schema ' || n.nspname || ' exists and belongs to role '
           || quote_ident(pg_get_userbyid(n.nspowner)) || ', not to '
           || quote_ident(current_user) || ', which applies this script'
      INTO refusal
      FROM pg_namespace n
     WHERE n.nspname = @reactor_name@ AND pg_get_userbyid(n.nspowner) <> current_user;
    IF refusal IS NULL THEN
        SELECT u.problem INTO refusal FROM ({{untrusted_problems}}) AS u LIMIT 1;
    END IF;
    IF refusal IS NOT NULL THEN
        RAISE EXCEPTION USING MESSAGE = 'reactor: ' || refusal
            || '; nothing was changed (see docs/security.md)';
    END IF;
END
$reactor_trust$
