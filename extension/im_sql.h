/*
 * im_sql.h — SQL fragments shared by the extension's statements.
 *
 * Every statement runs with the caller's search_path pinned to the
 * extension's, but operators are still schema-qualified: an operator found
 * through search_path could be a user's overload.  These macros spell them
 * once.  Each macro is a string literal with spaces around it, so it
 * concatenates into a statement: "WHERE a" EQ "$1".
 */
#ifndef IM_SQL_H
#define IM_SQL_H

#define EQ " OPERATOR(pg_catalog.=) "
#define NE " OPERATOR(pg_catalog.<>) "
#define LT " OPERATOR(pg_catalog.<) "
#define LE " OPERATOR(pg_catalog.<=) "
#define GT " OPERATOR(pg_catalog.>) "
#define GE " OPERATOR(pg_catalog.>=) "
#define PLUS " OPERATOR(pg_catalog.+) "
#define MINUS " OPERATOR(pg_catalog.-) "

#endif							/* IM_SQL_H */
