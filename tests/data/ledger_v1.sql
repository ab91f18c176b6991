-- A ledger written at schema version 1 (real rows), by tests/data/make_ledger_v1.py.
-- Load it raw, then PRAGMA application_id = 1129534548; PRAGMA user_version = 1.
BEGIN TRANSACTION;
CREATE TABLE cassette_jobs (
    job_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (job_id > 0),
    message_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    intent TEXT NOT NULL CONSTRAINT INVALID_INTENT CHECK (length(intent) BETWEEN 1 AND 200),
    ordinal INTEGER NOT NULL CONSTRAINT INVALID_ORDINAL CHECK (ordinal >= 0),
    created_at INTEGER NOT NULL,
    UNIQUE (message_id, ordinal)
) STRICT;
INSERT INTO "cassette_jobs" VALUES(1,1,'run-v1','default',0,1790000000000);
INSERT INTO "cassette_jobs" VALUES(2,2,'run-v1','default',0,1790000000000);
INSERT INTO "cassette_jobs" VALUES(3,3,'run-v1','default',0,1790000000000);
INSERT INTO "cassette_jobs" VALUES(4,4,'run-v1','research',0,1790000000000);
INSERT INTO "cassette_jobs" VALUES(5,4,'run-v1','write',1,1790000000000);
CREATE TABLE cassette_journal (
    seq INTEGER PRIMARY KEY CONSTRAINT JOURNAL_BROKEN CHECK (seq >= 0),
    body TEXT NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (json_valid(body)),
    leaf_hash BLOB NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (length(leaf_hash) = 32),
    chain_hash BLOB NOT NULL CONSTRAINT JOURNAL_BROKEN CHECK (length(chain_hash) = 32),
    tbl TEXT GENERATED ALWAYS AS (json_extract(body, '$.table')) VIRTUAL,
    row_key ANY GENERATED ALWAYS AS (json_extract(body, '$.key')) VIRTUAL
) STRICT;
INSERT INTO "cassette_journal" VALUES(0,'{"table":"cassette_messages","op":"INSERT","key":1,"row":{"message_id":1,"run_id":"run-v1","source":"USER","idempotency_key":"k0","payload_json":"{\"task\":\"t0\"}","created_at":1790000000000}}',X'DC7F2B5E5239643C77A8BD90BD75BE0DD810CF2AD45A0BA0E4DF5F52C9CCEB7E',X'E732DF332620DF01D3FA3D07095C41AB035093695CBC8C51592FB09852346931');
INSERT INTO "cassette_journal" VALUES(1,'{"table":"cassette_jobs","op":"INSERT","key":1,"row":{"job_id":1,"message_id":1,"run_id":"run-v1","intent":"default","ordinal":0,"created_at":1790000000000}}',X'8E68E90E7EBCF1526163F0C4181B301B219CD55A11B4B61E7B13E40CC163CC48',X'8CBEF0BE2F73D9FB37702C955DF4174D27340FE4BB9440D30B6D6279B9DFF8B4');
INSERT INTO "cassette_journal" VALUES(2,'{"table":"cassette_steps","op":"INSERT","key":1,"row":{"step_id":1,"job_id":1,"run_id":"run-v1","message_id":1,"job_ordinal":0,"ordinal":0,"status":"PENDING","lease_owner":null,"lease_expires_at":null,"fencing_token":0,"payload_json":"{\"task\":\"t0\"}","created_at":1790000000000}}',X'2183525FA40128D4B2EBD51D037F11E47A2856FA8C305A0AB653F68D61974672',X'E77B401BCEBA1A63BEB15FD6CC5D5487D234C723F60F2AF1E571D963B8F878E3');
INSERT INTO "cassette_journal" VALUES(3,'{"table":"cassette_messages","op":"INSERT","key":2,"row":{"message_id":2,"run_id":"run-v1","source":"USER","idempotency_key":"k1","payload_json":"{\"task\":\"t1\"}","created_at":1790000000000}}',X'929AD5123D23A1138DE493472386CCFDB35DE5CCE2E25F25EA172E059C2FF4C4',X'AE62BBA9012D4E1685A9C90B5D2D2BA580A35997B74DD22248D70B4CE71354F6');
INSERT INTO "cassette_journal" VALUES(4,'{"table":"cassette_jobs","op":"INSERT","key":2,"row":{"job_id":2,"message_id":2,"run_id":"run-v1","intent":"default","ordinal":0,"created_at":1790000000000}}',X'4FE73ADF272F3B3C3F81D55E99C93C252AE21E23CA905AFE53C16F9189DCE274',X'6AA83865B4DC07CB563F89AB11E30E04A042001139CC4E3E3D67C6896584C4BF');
INSERT INTO "cassette_journal" VALUES(5,'{"table":"cassette_steps","op":"INSERT","key":2,"row":{"step_id":2,"job_id":2,"run_id":"run-v1","message_id":2,"job_ordinal":0,"ordinal":0,"status":"PENDING","lease_owner":null,"lease_expires_at":null,"fencing_token":0,"payload_json":"{\"task\":\"t1\"}","created_at":1790000000000}}',X'6AD74DD5F8E6D46429A14FF77BC99C4194C2A85F2E77AD3A5C51796AE4445C0A',X'638C1AA5800EC759582BC7C10E0D291A134D02875804524EF1328C749246BF94');
INSERT INTO "cassette_journal" VALUES(6,'{"table":"cassette_messages","op":"INSERT","key":3,"row":{"message_id":3,"run_id":"run-v1","source":"USER","idempotency_key":"k2","payload_json":"{\"task\":\"t2\"}","created_at":1790000000000}}',X'D1E55D8D544AA7EDD2BD82EBA8F1E1453A1514831B124BB53EFEE9CF34913BF7',X'04EA4E29F12BA2C28DA8E1CCDA0300125E8E16203AFD7F8984D99885B854AD24');
INSERT INTO "cassette_journal" VALUES(7,'{"table":"cassette_jobs","op":"INSERT","key":3,"row":{"job_id":3,"message_id":3,"run_id":"run-v1","intent":"default","ordinal":0,"created_at":1790000000000}}',X'FC2714FB3179E07AA8D6C3C9D2F8DE78F0CC213BF3D62C82CC200F5FFD31D8FE',X'C7EDC23436C3654A42B876662F3E4E4A664D634FB6B9ED7FBDDE0E37440C9AF1');
INSERT INTO "cassette_journal" VALUES(8,'{"table":"cassette_steps","op":"INSERT","key":3,"row":{"step_id":3,"job_id":3,"run_id":"run-v1","message_id":3,"job_ordinal":0,"ordinal":0,"status":"PENDING","lease_owner":null,"lease_expires_at":null,"fencing_token":0,"payload_json":"{\"task\":\"t2\"}","created_at":1790000000000}}',X'A46D3BE471E337E2AFE3DFEF2E01222B5E67C6CC4E95BDE146BBF77C0AA386E4',X'4605C395C08FAA8303CA1F812901A77C5A7B7259DC5310FA064ADDFE40937B1E');
INSERT INTO "cassette_journal" VALUES(9,'{"table":"cassette_messages","op":"INSERT","key":4,"row":{"message_id":4,"run_id":"run-v1","source":"PLANNER","idempotency_key":null,"payload_json":"{\"jobs\":[{\"intent\":\"research\",\"steps\":[{\"q\":1},{\"q\":2}]},{\"intent\":\"write\",\"steps\":[{\"f\":\"md\"}]}]}","created_at":1790000000000}}',X'C0EF97D54DF3D809BA594D83D4EDCFE15A867DF61DAE342AFCD3200BF2FAFC6A',X'D028AB6CA0C62FF6C4C120AB05853FA993A9D04ACB73349BF5AA769D3BBA7366');
INSERT INTO "cassette_journal" VALUES(10,'{"table":"cassette_jobs","op":"INSERT","key":4,"row":{"job_id":4,"message_id":4,"run_id":"run-v1","intent":"research","ordinal":0,"created_at":1790000000000}}',X'0995BB4577EF358397755E88583356B77A6BC3EB258DD43CCDA5D4268AB84C1B',X'499D64FBE7C250A5C870DAA01B9F73B5B736562CA7FEB3E971949BB51231DB38');
INSERT INTO "cassette_journal" VALUES(11,'{"table":"cassette_steps","op":"INSERT","key":4,"row":{"step_id":4,"job_id":4,"run_id":"run-v1","message_id":4,"job_ordinal":0,"ordinal":0,"status":"PENDING","lease_owner":null,"lease_expires_at":null,"fencing_token":0,"payload_json":"{\"q\":1}","created_at":1790000000000}}',X'AB4FFBAEB040E594B28A66070C3F53176A46A8F34357A64D53296D7964B77489',X'32B41C5B7555D65830CEA0D4BCA73ADA4513918EDF13C7C05DF9C2E550B525F8');
INSERT INTO "cassette_journal" VALUES(12,'{"table":"cassette_steps","op":"INSERT","key":5,"row":{"step_id":5,"job_id":4,"run_id":"run-v1","message_id":4,"job_ordinal":0,"ordinal":1,"status":"PENDING","lease_owner":null,"lease_expires_at":null,"fencing_token":0,"payload_json":"{\"q\":2}","created_at":1790000000000}}',X'76E6FA23E7EE8F23052C3F39AAC7B91C707C6521AD72422452CC14CE66927AEE',X'A5FF5077588611AB575A0FD5137BE890755738D171A8B1F27F08DE1813B8FA09');
INSERT INTO "cassette_journal" VALUES(13,'{"table":"cassette_jobs","op":"INSERT","key":5,"row":{"job_id":5,"message_id":4,"run_id":"run-v1","intent":"write","ordinal":1,"created_at":1790000000000}}',X'EAFF550E5AA5E03C177F8531392E7A76CF55D0E092298B5C914B32124A9A3D69',X'0DDE74DE32F726332714F04094C715A075B5B295F085B6A9BDFAE6B91FDEB6FE');
INSERT INTO "cassette_journal" VALUES(14,'{"table":"cassette_steps","op":"INSERT","key":6,"row":{"step_id":6,"job_id":5,"run_id":"run-v1","message_id":4,"job_ordinal":1,"ordinal":0,"status":"PENDING","lease_owner":null,"lease_expires_at":null,"fencing_token":0,"payload_json":"{\"f\":\"md\"}","created_at":1790000000000}}',X'F1DE822EB4D8DE4F801CD9DF31CB31FF9F087B53F984B77A38CAB15638E00F94',X'43653F0B0A0B1DFE345427B151B9038E78ABF468752E9BB65B004D0AF8FD5E50');
INSERT INTO "cassette_journal" VALUES(15,'{"table":"cassette_steps","op":"UPDATE","key":1,"row":{"step_id":1,"job_id":1,"run_id":"run-v1","message_id":1,"job_ordinal":0,"ordinal":0,"status":"LEASED","lease_owner":"w1","lease_expires_at":1790000060000,"fencing_token":1,"payload_json":"{\"task\":\"t0\"}","created_at":1790000000000}}',X'91C66238BF4FA1E75B7A9BD788CB4303E8F60A1AB432444CCC49A4653E2CCFE1',X'E62FBC109A2B0052462C1FB96D963A69CD84D7F5672F7FD78A1BFE39F3B95386');
INSERT INTO "cassette_journal" VALUES(16,'{"table":"cassette_receipts","op":"INSERT","key":1,"row":{"receipt_id":1,"step_id":1,"job_id":1,"run_id":"run-v1","worker_id":"w1","fencing_token":1,"outcome":"SUCCESS","receipt_json":"{\"ok\":true}","created_at":1790000000000}}',X'CB652C6D9AAF76523BE77CE0160CD30505D4D285879F45F56DBF603DA5F5B91E',X'8BCAD5EF31B22CE221EB08BD58C60BE6BD691670BD5F54C10032ED8C52C2E1E0');
INSERT INTO "cassette_journal" VALUES(17,'{"table":"cassette_steps","op":"UPDATE","key":1,"row":{"step_id":1,"job_id":1,"run_id":"run-v1","message_id":1,"job_ordinal":0,"ordinal":0,"status":"COMMITTED","lease_owner":"w1","lease_expires_at":1790000060000,"fencing_token":1,"payload_json":"{\"task\":\"t0\"}","created_at":1790000000000}}',X'96932DE3AFEA492BF7EEA061BCAE5BE345777B18F02FBB2B8A37AFB3F200F14B',X'425ADCB05115533551A3D24CFBB1CF939691DC53BC398DF9212CC5A3CC9D1949');
INSERT INTO "cassette_journal" VALUES(18,'{"table":"cassette_steps","op":"UPDATE","key":2,"row":{"step_id":2,"job_id":2,"run_id":"run-v1","message_id":2,"job_ordinal":0,"ordinal":0,"status":"LEASED","lease_owner":"w2","lease_expires_at":1790000060000,"fencing_token":1,"payload_json":"{\"task\":\"t1\"}","created_at":1790000000000}}',X'F147CFA4F034A54909C4C3D69E046AB70EAD0DA85B7B4364E7744B32782C45A9',X'4B7DFE9469E4E2BEFB988946BDDA6FBE4FD61F02E526F4648101993BCE5AB36A');
INSERT INTO "cassette_journal" VALUES(19,'{"table":"cassette_receipts","op":"INSERT","key":2,"row":{"receipt_id":2,"step_id":2,"job_id":2,"run_id":"run-v1","worker_id":"w2","fencing_token":1,"outcome":"FAILURE","receipt_json":"{\"e\":1}","created_at":1790000000000}}',X'1CAB394A12640FE41152CC6833F3B2DDE0B3B7F4F902C0CD697D41AE15A8E9F2',X'A68369EAB3199EB806C28BC606F91A3EDBDCEE98BF5EF0ECF1FAEDC8067A2AAE');
INSERT INTO "cassette_journal" VALUES(20,'{"table":"cassette_steps","op":"UPDATE","key":2,"row":{"step_id":2,"job_id":2,"run_id":"run-v1","message_id":2,"job_ordinal":0,"ordinal":0,"status":"COMMITTED","lease_owner":"w2","lease_expires_at":1790000060000,"fencing_token":1,"payload_json":"{\"task\":\"t1\"}","created_at":1790000000000}}',X'762D9CEFF58183F5CC4E66C4CCFF9D4E23D3D779CCBB14DD3BE9263AF70A59A2',X'06A3F3DD947550E20CACC130C78DFB4AF28214CC1E7D2D2DD6E6E6843984A76C');
INSERT INTO "cassette_journal" VALUES(21,'{"table":"cassette_steps","op":"UPDATE","key":3,"row":{"step_id":3,"job_id":3,"run_id":"run-v1","message_id":3,"job_ordinal":0,"ordinal":0,"status":"LEASED","lease_owner":"w3","lease_expires_at":1790000001000,"fencing_token":1,"payload_json":"{\"task\":\"t2\"}","created_at":1790000000000}}',X'328A749D22E0627361D3E25BC2AFA1A70B3C3A323F9AA2D072D1913D38041DEF',X'07E9C2CAAA8FBE1CE3A1752CE0E0C6043FBE1CF142AE9BB8153B7CDBE315887E');
INSERT INTO "cassette_journal" VALUES(22,'{"table":"cassette_steps","op":"UPDATE","key":3,"row":{"step_id":3,"job_id":3,"run_id":"run-v1","message_id":3,"job_ordinal":0,"ordinal":0,"status":"PENDING","lease_owner":null,"lease_expires_at":null,"fencing_token":1,"payload_json":"{\"task\":\"t2\"}","created_at":1790000000000}}',X'1F355B389AB04DE2386C6614C27E195BD6B1B4870D5F350234C8DF03E5338ACA',X'07A561701CD8BCFCDE0FAAE3CF23CC1AE4F23E4554C25D52E7A1287FD075AEF1');
INSERT INTO "cassette_journal" VALUES(23,'{"table":"cassette_steps","op":"UPDATE","key":3,"row":{"step_id":3,"job_id":3,"run_id":"run-v1","message_id":3,"job_ordinal":0,"ordinal":0,"status":"LEASED","lease_owner":"w4","lease_expires_at":1790000062000,"fencing_token":2,"payload_json":"{\"task\":\"t2\"}","created_at":1790000000000}}',X'B2A342D04E675493E1F6CB49CC25093800D863C5A6F588DB11BAB7091B618487',X'4A19254AA6B80E55A5F2B59ED13C184600535246844E5202FD6254EEB9E47036');
INSERT INTO "cassette_journal" VALUES(24,'{"table":"cassette_releases","op":"INSERT","key":1,"row":{"release_id":1,"step_id":3,"run_id":"run-v1","worker_id":"w4","fencing_token":2,"created_at":1790000002000}}',X'CF82EC3EF9702C3B0FFFCE839A7991D9C5F184843092572108A8E3886392F76E',X'778683BD60DB6906394DE7546C81C75D9CAB7287CE7F4B99107292A7DF27E1AD');
INSERT INTO "cassette_journal" VALUES(25,'{"table":"cassette_steps","op":"UPDATE","key":3,"row":{"step_id":3,"job_id":3,"run_id":"run-v1","message_id":3,"job_ordinal":0,"ordinal":0,"status":"PENDING","lease_owner":null,"lease_expires_at":null,"fencing_token":2,"payload_json":"{\"task\":\"t2\"}","created_at":1790000000000}}',X'E2D6579AC79DF4431258A08C65549C71B05D5E400BA4EC4756C60A11DF59A006',X'48AE851FA5AB0CAA2C2A8AC784BE667852C3D687C77F923B0CAA4EF762D63370');
INSERT INTO "cassette_journal" VALUES(26,'{"table":"cassette_steps","op":"UPDATE","key":3,"row":{"step_id":3,"job_id":3,"run_id":"run-v1","message_id":3,"job_ordinal":0,"ordinal":0,"status":"LEASED","lease_owner":"w5","lease_expires_at":1790000062000,"fencing_token":3,"payload_json":"{\"task\":\"t2\"}","created_at":1790000000000}}',X'3A7DF07CC19B7DA64320C30222EFA0FAFA61D7471C2C92C0CA691612FDA6F855',X'ED6E23341AE68B1AC0E360B69746B181D4659FD20AE7E5AE2EA2712BF674DAE0');
CREATE TABLE cassette_messages (
    message_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (message_id > 0),
    run_id TEXT NOT NULL CONSTRAINT INVALID_RUN_ID CHECK (length(run_id) BETWEEN 1 AND 200),
    source TEXT NOT NULL
        CONSTRAINT INVALID_SOURCE CHECK (source IN ('USER', 'PLANNER', 'SYSTEM', 'WORKER')),
    idempotency_key TEXT
        CONSTRAINT INVALID_IDEMPOTENCY_KEY CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    payload_json TEXT NOT NULL
        CONSTRAINT INVALID_PAYLOAD CHECK (
            CASE WHEN json_valid(payload_json) THEN json_type(payload_json) = 'object' ELSE 0 END
        ),
    created_at INTEGER NOT NULL,
    UNIQUE (run_id, idempotency_key)
) STRICT;
INSERT INTO "cassette_messages" VALUES(1,'run-v1','USER','k0','{"task":"t0"}',1790000000000);
INSERT INTO "cassette_messages" VALUES(2,'run-v1','USER','k1','{"task":"t1"}',1790000000000);
INSERT INTO "cassette_messages" VALUES(3,'run-v1','USER','k2','{"task":"t2"}',1790000000000);
INSERT INTO "cassette_messages" VALUES(4,'run-v1','PLANNER',NULL,'{"jobs":[{"intent":"research","steps":[{"q":1},{"q":2}]},{"intent":"write","steps":[{"f":"md"}]}]}',1790000000000);
CREATE TABLE cassette_meta (
    key TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) STRICT;
INSERT INTO "cassette_meta" VALUES('format','catalytic-cassette');
CREATE TABLE cassette_migrations (
    version INTEGER PRIMARY KEY NOT NULL CHECK (version > 0),
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL CHECK (length(sha256) = 64)
) STRICT;
INSERT INTO "cassette_migrations" VALUES(1,'cassette','db0645f3d3532b23b07468bb7522887a11462325ea3cacd7dd0550168d676580');
CREATE TABLE cassette_receipts (
    receipt_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (receipt_id > 0),
    step_id INTEGER NOT NULL UNIQUE,
    job_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    worker_id TEXT NOT NULL CONSTRAINT INVALID_WORKER CHECK (length(worker_id) BETWEEN 1 AND 200),
    fencing_token INTEGER NOT NULL,
    outcome TEXT NOT NULL
        CONSTRAINT INVALID_OUTCOME CHECK (outcome IN ('SUCCESS', 'FAILURE', 'ABORTED')),
    receipt_json TEXT NOT NULL
        CONSTRAINT INVALID_PAYLOAD CHECK (
            CASE WHEN json_valid(receipt_json) THEN json_type(receipt_json) = 'object' ELSE 0 END
        ),
    created_at INTEGER NOT NULL
) STRICT;
INSERT INTO "cassette_receipts" VALUES(1,1,1,'run-v1','w1',1,'SUCCESS','{"ok":true}',1790000000000);
INSERT INTO "cassette_receipts" VALUES(2,2,2,'run-v1','w2',1,'FAILURE','{"e":1}',1790000000000);
CREATE TABLE cassette_releases (
    release_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (release_id > 0),
    step_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    worker_id TEXT NOT NULL CONSTRAINT INVALID_WORKER CHECK (length(worker_id) BETWEEN 1 AND 200),
    fencing_token INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (step_id, fencing_token)
) STRICT;
INSERT INTO "cassette_releases" VALUES(1,3,'run-v1','w4',2,1790000002000);
CREATE TABLE cassette_steps (
    step_id INTEGER PRIMARY KEY CONSTRAINT INVALID_ID CHECK (step_id > 0),
    job_id INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    message_id INTEGER NOT NULL,
    job_ordinal INTEGER NOT NULL,
    ordinal INTEGER NOT NULL CONSTRAINT INVALID_ORDINAL CHECK (ordinal >= 0),
    status TEXT NOT NULL
        CONSTRAINT INVALID_STATUS CHECK (status IN ('PENDING', 'LEASED', 'COMMITTED')),
    lease_owner TEXT,
    lease_expires_at INTEGER,
    fencing_token INTEGER NOT NULL CONSTRAINT INVALID_TOKEN CHECK (fencing_token >= 0),
    payload_json TEXT NOT NULL
        CONSTRAINT INVALID_PAYLOAD CHECK (
            CASE WHEN json_valid(payload_json) THEN json_type(payload_json) = 'object' ELSE 0 END
        ),
    created_at INTEGER NOT NULL,
    UNIQUE (job_id, ordinal)
) STRICT;
INSERT INTO "cassette_steps" VALUES(1,1,'run-v1',1,0,0,'COMMITTED','w1',1790000060000,1,'{"task":"t0"}',1790000000000);
INSERT INTO "cassette_steps" VALUES(2,2,'run-v1',2,0,0,'COMMITTED','w2',1790000060000,1,'{"task":"t1"}',1790000000000);
INSERT INTO "cassette_steps" VALUES(3,3,'run-v1',3,0,0,'LEASED','w5',1790000062000,3,'{"task":"t2"}',1790000000000);
INSERT INTO "cassette_steps" VALUES(4,4,'run-v1',4,0,0,'PENDING',NULL,NULL,0,'{"q":1}',1790000000000);
INSERT INTO "cassette_steps" VALUES(5,4,'run-v1',4,0,1,'PENDING',NULL,NULL,0,'{"q":2}',1790000000000);
INSERT INTO "cassette_steps" VALUES(6,5,'run-v1',4,1,0,'PENDING',NULL,NULL,0,'{"f":"md"}',1790000000000);
CREATE INDEX cassette_steps_claimable
    ON cassette_steps (run_id, message_id, job_ordinal, ordinal)
    WHERE status = 'PENDING';
CREATE INDEX cassette_steps_leased
    ON cassette_steps (run_id, lease_expires_at)
    WHERE status = 'LEASED';
CREATE INDEX cassette_steps_by_run_status ON cassette_steps (run_id, status);
CREATE INDEX cassette_receipts_by_run ON cassette_receipts (run_id, outcome);
CREATE INDEX cassette_journal_by_row ON cassette_journal (tbl, row_key, seq);
CREATE TRIGGER cassette_meta_no_update BEFORE UPDATE ON cassette_meta
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be updated'); END;
CREATE TRIGGER cassette_meta_no_delete BEFORE DELETE ON cassette_meta
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be deleted'); END;
CREATE TRIGGER cassette_meta_insert_guard BEFORE INSERT ON cassette_meta
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_meta rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_meta WHERE key = NEW.key);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
END;
CREATE TRIGGER cassette_migrations_no_update BEFORE UPDATE ON cassette_migrations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be updated'); END;
CREATE TRIGGER cassette_migrations_no_delete BEFORE DELETE ON cassette_migrations
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be deleted'); END;
CREATE TRIGGER cassette_migrations_insert_guard BEFORE INSERT ON cassette_migrations
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_migrations rows cannot be replaced')
    WHERE EXISTS (SELECT 1 FROM cassette_migrations WHERE version = NEW.version);
    SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: only a cassette connection migrates the ledger')
    WHERE NOT EXISTS (SELECT 1 FROM pragma_function_list WHERE name = 'cassette_chain_hash');
END;
CREATE TRIGGER cassette_messages_no_update BEFORE UPDATE ON cassette_messages
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_messages rows cannot be updated'); END;
CREATE TRIGGER cassette_messages_no_delete BEFORE DELETE ON cassette_messages
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_messages rows cannot be deleted'); END;
CREATE TRIGGER cassette_jobs_no_update BEFORE UPDATE ON cassette_jobs
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_jobs rows cannot be updated'); END;
CREATE TRIGGER cassette_jobs_no_delete BEFORE DELETE ON cassette_jobs
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_jobs rows cannot be deleted'); END;
CREATE TRIGGER cassette_steps_no_delete BEFORE DELETE ON cassette_steps
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_steps rows cannot be deleted'); END;
CREATE TRIGGER cassette_receipts_no_update BEFORE UPDATE ON cassette_receipts
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_receipts rows cannot be updated'); END;
CREATE TRIGGER cassette_receipts_no_delete BEFORE DELETE ON cassette_receipts
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_receipts rows cannot be deleted'); END;
CREATE TRIGGER cassette_releases_no_update BEFORE UPDATE ON cassette_releases
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_releases rows cannot be updated'); END;
CREATE TRIGGER cassette_releases_no_delete BEFORE DELETE ON cassette_releases
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_releases rows cannot be deleted'); END;
CREATE TRIGGER cassette_journal_no_update BEFORE UPDATE ON cassette_journal
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_journal rows cannot be updated'); END;
CREATE TRIGGER cassette_journal_no_delete BEFORE DELETE ON cassette_journal
BEGIN SELECT RAISE(ABORT, 'APPEND_ONLY: cassette_journal rows cannot be deleted'); END;
CREATE TRIGGER cassette_messages_insert_guard BEFORE INSERT ON cassette_messages
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a message with this message_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_messages WHERE message_id = NEW.message_id);
    SELECT RAISE(ABORT, 'IDEMPOTENCY_CONFLICT: a message with this run_id and idempotency_key exists')
    WHERE NEW.idempotency_key IS NOT NULL
      AND EXISTS (SELECT 1 FROM cassette_messages
                  WHERE run_id = NEW.run_id AND idempotency_key = NEW.idempotency_key);
END;
CREATE TRIGGER cassette_messages_in_order AFTER INSERT ON cassette_messages
-- (a rowid range probe: max() would let the planner pick a covering index and scan it)
WHEN EXISTS (SELECT 1 FROM cassette_messages WHERE message_id > NEW.message_id)
BEGIN SELECT RAISE(ABORT, 'OUT_OF_ORDER: a message_id must be larger than every existing one'); END;
CREATE TRIGGER cassette_jobs_insert_guard BEFORE INSERT ON cassette_jobs
BEGIN
    SELECT RAISE(ABORT, 'APPEND_ONLY: a job with this job_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_jobs WHERE job_id = NEW.job_id);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a job with this message_id and ordinal exists')
    WHERE EXISTS (SELECT 1 FROM cassette_jobs
                  WHERE message_id = NEW.message_id AND ordinal = NEW.ordinal);
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the job''s message does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_messages WHERE message_id = NEW.message_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: a job''s run_id must equal its message''s run_id')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_messages WHERE message_id = NEW.message_id);
END;
CREATE TRIGGER cassette_steps_insert_guard BEFORE INSERT ON cassette_steps
BEGIN
    SELECT RAISE(ABORT, 'INVALID_STATUS: status is PENDING, LEASED or COMMITTED')
    WHERE NEW.status IS NULL OR NEW.status NOT IN ('PENDING', 'LEASED', 'COMMITTED');
    SELECT RAISE(ABORT, 'INVALID_TOKEN: a fencing token is a non-negative integer')
    WHERE typeof(NEW.fencing_token) IS NOT 'integer' OR NEW.fencing_token < 0;
    SELECT RAISE(ABORT, 'APPEND_ONLY: a step with this step_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a step with this job_id and ordinal exists')
    WHERE EXISTS (SELECT 1 FROM cassette_steps WHERE job_id = NEW.job_id AND ordinal = NEW.ordinal);
    SELECT RAISE(ABORT, 'REFERENCE_MISSING: the step''s job does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_jobs WHERE job_id = NEW.job_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: a step''s run_id must equal its job''s run_id')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_jobs WHERE job_id = NEW.job_id);
    SELECT RAISE(ABORT, 'REFERENCE_MISMATCH: a step''s message_id and job_ordinal must equal its job''s')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_jobs WHERE job_id = NEW.job_id
                      AND message_id IS NEW.message_id AND ordinal IS NEW.job_ordinal);
    SELECT RAISE(ABORT, 'ILLEGAL_TRANSITION: a step is inserted as PENDING')
    WHERE NEW.status IS NOT 'PENDING';
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: a step is inserted with token 0 and no lease')
    WHERE NEW.fencing_token IS NOT 0 OR NEW.lease_owner IS NOT NULL
       OR NEW.lease_expires_at IS NOT NULL;
END;
CREATE TRIGGER cassette_steps_update_guard BEFORE UPDATE ON cassette_steps
BEGIN
    SELECT RAISE(ABORT, 'INVALID_STATUS: status is PENDING, LEASED or COMMITTED')
    WHERE NEW.status IS NULL OR NEW.status NOT IN ('PENDING', 'LEASED', 'COMMITTED');
    SELECT RAISE(ABORT, 'INVALID_TOKEN: a fencing token is a non-negative integer')
    WHERE typeof(NEW.fencing_token) IS NOT 'integer' OR NEW.fencing_token < 0;
    SELECT RAISE(ABORT, 'IMMUTABLE_FIELD: only status, lease fields and fencing_token of a step change')
    WHERE NEW.step_id IS NOT OLD.step_id OR NEW.job_id IS NOT OLD.job_id
       OR NEW.run_id IS NOT OLD.run_id OR NEW.message_id IS NOT OLD.message_id
       OR NEW.job_ordinal IS NOT OLD.job_ordinal OR NEW.ordinal IS NOT OLD.ordinal
       OR NEW.payload_json IS NOT OLD.payload_json OR NEW.created_at IS NOT OLD.created_at;
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: lease fields change only with a claim or a requeue')
    WHERE NEW.status IS OLD.status
      AND (NEW.lease_owner IS NOT OLD.lease_owner OR NEW.lease_expires_at IS NOT OLD.lease_expires_at
           OR NEW.fencing_token IS NOT OLD.fencing_token);
    SELECT RAISE(ABORT, 'ILLEGAL_TRANSITION: allowed are PENDING->LEASED, LEASED->COMMITTED, LEASED->PENDING')
    WHERE NOT ((OLD.status = 'PENDING' AND NEW.status IS 'LEASED')
            OR (OLD.status = 'LEASED' AND NEW.status IS 'COMMITTED')
            OR (OLD.status = 'LEASED' AND NEW.status IS 'PENDING'));
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: a claim sets lease_owner and lease_expires_at and adds 1 to the token')
    WHERE OLD.status = 'PENDING' AND NEW.status IS 'LEASED'
      AND (NEW.lease_owner IS NULL OR length(NEW.lease_owner) NOT BETWEEN 1 AND 200
           OR typeof(NEW.lease_expires_at) IS NOT 'integer'
           OR NEW.fencing_token IS NOT OLD.fencing_token + 1);
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: a requeue clears the lease and keeps the token')
    WHERE OLD.status = 'LEASED' AND NEW.status IS 'PENDING'
      AND (NEW.lease_owner IS NOT NULL OR NEW.lease_expires_at IS NOT NULL
           OR NEW.fencing_token IS NOT OLD.fencing_token);
    SELECT RAISE(ABORT, 'LEASE_FIELDS_LOCKED: committing keeps the lease fields and the token')
    WHERE OLD.status = 'LEASED' AND NEW.status IS 'COMMITTED'
      AND (NEW.lease_owner IS NOT OLD.lease_owner OR NEW.lease_expires_at IS NOT OLD.lease_expires_at
           OR NEW.fencing_token IS NOT OLD.fencing_token);
    SELECT RAISE(ABORT, 'RECEIPT_REQUIRED: a step is committed only by inserting its receipt')
    WHERE OLD.status = 'LEASED' AND NEW.status IS 'COMMITTED'
      AND NOT EXISTS (SELECT 1 FROM cassette_receipts r WHERE r.step_id = OLD.step_id
                      AND r.fencing_token = OLD.fencing_token AND r.worker_id = OLD.lease_owner);
END;
CREATE TRIGGER cassette_receipts_insert_guard BEFORE INSERT ON cassette_receipts
BEGIN
    SELECT RAISE(ABORT, 'INVALID_WORKER: worker_id is a string of 1-200 characters')
    WHERE typeof(NEW.worker_id) IS NOT 'text' OR length(NEW.worker_id) NOT BETWEEN 1 AND 200;
    SELECT RAISE(ABORT, 'INVALID_OUTCOME: outcome is SUCCESS, FAILURE or ABORTED')
    WHERE NEW.outcome IS NULL OR NEW.outcome NOT IN ('SUCCESS', 'FAILURE', 'ABORTED');
    SELECT RAISE(ABORT, 'APPEND_ONLY: a receipt with this receipt_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_receipts WHERE receipt_id = NEW.receipt_id);
    SELECT RAISE(ABORT, 'STEP_NOT_FOUND: the receipt''s step does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'DUPLICATE_RECEIPT: this step already has its receipt')
    WHERE EXISTS (SELECT 1 FROM cassette_receipts WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: the step belongs to another run')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'REFERENCE_MISMATCH: a receipt''s job_id must be its step''s job')
    WHERE NEW.job_id IS NOT (SELECT job_id FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'NOT_LEASED: only a LEASED step takes a receipt')
    WHERE (SELECT status FROM cassette_steps WHERE step_id = NEW.step_id) IS NOT 'LEASED';
    SELECT RAISE(ABORT, 'STALE_FENCING_TOKEN: the token is not the step''s current token')
    WHERE NEW.fencing_token IS NOT (SELECT fencing_token FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'WRONG_WORKER: only the lease owner completes a step')
    WHERE NEW.worker_id IS NOT (SELECT lease_owner FROM cassette_steps WHERE step_id = NEW.step_id);
END;
CREATE TRIGGER cassette_receipts_commit_step AFTER INSERT ON cassette_receipts
BEGIN
    UPDATE cassette_steps SET status = 'COMMITTED' WHERE step_id = NEW.step_id;
END;
CREATE TRIGGER cassette_releases_insert_guard BEFORE INSERT ON cassette_releases
BEGIN
    SELECT RAISE(ABORT, 'INVALID_WORKER: worker_id is a string of 1-200 characters')
    WHERE typeof(NEW.worker_id) IS NOT 'text' OR length(NEW.worker_id) NOT BETWEEN 1 AND 200;
    SELECT RAISE(ABORT, 'APPEND_ONLY: a release with this release_id exists')
    WHERE EXISTS (SELECT 1 FROM cassette_releases WHERE release_id = NEW.release_id);
    SELECT RAISE(ABORT, 'APPEND_ONLY: a release of this step with this token exists')
    WHERE EXISTS (SELECT 1 FROM cassette_releases
                  WHERE step_id = NEW.step_id AND fencing_token = NEW.fencing_token);
    SELECT RAISE(ABORT, 'STEP_NOT_FOUND: the released step does not exist')
    WHERE NOT EXISTS (SELECT 1 FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'RUN_MISMATCH: the step belongs to another run')
    WHERE NEW.run_id IS NOT (SELECT run_id FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'NOT_LEASED: only a LEASED step can be released')
    WHERE (SELECT status FROM cassette_steps WHERE step_id = NEW.step_id) IS NOT 'LEASED';
    SELECT RAISE(ABORT, 'STALE_FENCING_TOKEN: the token is not the step''s current token')
    WHERE NEW.fencing_token IS NOT (SELECT fencing_token FROM cassette_steps WHERE step_id = NEW.step_id);
    SELECT RAISE(ABORT, 'WRONG_WORKER: only the lease owner releases a step')
    WHERE NEW.worker_id IS NOT (SELECT lease_owner FROM cassette_steps WHERE step_id = NEW.step_id);
END;
CREATE TRIGGER cassette_releases_requeue_step AFTER INSERT ON cassette_releases
BEGIN
    UPDATE cassette_steps SET status = 'PENDING', lease_owner = NULL, lease_expires_at = NULL
    WHERE step_id = NEW.step_id;
END;
CREATE TRIGGER cassette_journal_insert_guard BEFORE INSERT ON cassette_journal
BEGIN
    SELECT RAISE(ABORT, 'JOURNAL_BROKEN: a journal entry continues the sequence and the chain')
    WHERE NEW.seq IS NOT coalesce((SELECT max(seq) FROM cassette_journal) + 1, 0)
       OR NEW.leaf_hash IS NOT cassette_leaf_hash(NEW.body)
       OR NEW.chain_hash IS NOT cassette_chain_hash(
              NEW.seq,
              coalesce((SELECT chain_hash FROM cassette_journal WHERE seq = NEW.seq - 1),
                       zeroblob(32)),
              NEW.leaf_hash);
END;
CREATE TRIGGER cassette_messages_journaled AFTER INSERT ON cassette_messages
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_messages' AND row_key = +NEW.message_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;
CREATE TRIGGER cassette_jobs_journaled AFTER INSERT ON cassette_jobs
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_jobs' AND row_key = +NEW.job_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;
CREATE TRIGGER cassette_steps_journaled AFTER INSERT ON cassette_steps
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_steps' AND row_key = +NEW.step_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;
CREATE TRIGGER cassette_steps_update_journaled AFTER UPDATE ON cassette_steps
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE seq = (SELECT max(seq) FROM cassette_journal)
                   AND tbl = 'cassette_steps' AND row_key = +NEW.step_id
                   AND json_extract(body, '$.row.status') IS NEW.status
                   AND json_extract(body, '$.row.fencing_token') IS NEW.fencing_token)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;
CREATE TRIGGER cassette_receipts_journaled AFTER INSERT ON cassette_receipts
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_receipts' AND row_key = +NEW.receipt_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;
CREATE TRIGGER cassette_releases_journaled AFTER INSERT ON cassette_releases
WHEN NOT EXISTS (SELECT 1 FROM cassette_journal
                 WHERE tbl = 'cassette_releases' AND row_key = +NEW.release_id)
BEGIN SELECT RAISE(ABORT, 'JOURNAL_REQUIRED: ledger writes need a cassette connection'); END;
COMMIT;
